"""AdmissionReview in and out, and the webhook configurations (pure): which webhooks the
operator serves and at which paths, the answer the API server reads, a new job's creation
defaults as a JSON patch, and the configurations the operator keeps itself with
--webhook-manage (the chart writes its own, to the same paths:
tests/unit/test_admission_review.py holds the two together)."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpo_api.contract import API_GROUP, API_VERSION, PLURAL

ADMISSION_API = "admission.k8s.io/v1"
WEBHOOK_API = "admissionregistration.k8s.io/v1"
# An update that leaves the spec alone (a finalizer, a label, an annotation) is not sent:
# the webhook allows it anyway, and with no replica answering, failurePolicy Fail would
# refuse it (the chart's webhook.yaml says the same).
SPEC_CHANGED = {"name": "spec-changed",
                "expression": "request.operation != 'UPDATE' || object.spec != oldObject.spec"}
TIMEOUT_SECONDS = 30  # the API server's most


@dataclass(frozen=True)
class Webhook:
    """One webhook: served at ``/<path>``, named ``name`` in its configuration."""

    path: str
    name: str
    operations: tuple[str, ...]
    mutating: bool


VALIDATE = Webhook("validate-grpojob", f"validate.{PLURAL}.{API_GROUP}", ("CREATE", "UPDATE"),
                   mutating=False)
DEFAULT = Webhook("default-grpojob", f"default.{PLURAL}.{API_GROUP}", ("CREATE",),
                  mutating=True)
WEBHOOKS = (VALIDATE, DEFAULT)


def webhook_at(path: str | None) -> Webhook | None:
    """The webhook served at this URL path (its last segment), or None."""
    last = (path or "").strip("/").rsplit("/", 1)[-1]
    return next((w for w in WEBHOOKS if w.path == last), None)


def review_answer(review: Mapping[str, Any], problem: str | None = None, code: int = 422,
                  warnings: Sequence[str] = (),
                  patch: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The AdmissionReview the API server expects back: allowed unless ``problem`` (then
    its words are what kubectl prints, with ``code``); ``warnings`` are printed beside an
    admitted object; ``patch``: JSON patch operations (a mutating webhook's)."""
    response: dict[str, Any] = {
        "uid": (review.get("request") or {}).get("uid", ""), "allowed": problem is None}
    if problem is not None:
        response["status"] = {"message": problem, "code": code}
    if warnings:
        response["warnings"] = [str(w) for w in warnings]
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(list(patch)).encode()).decode()
    return {"apiVersion": review.get("apiVersion", ADMISSION_API),
            "kind": review.get("kind", "AdmissionReview"), "response": response}


def _pointer(*keys: str) -> str:
    """A JSON pointer (RFC 6901): "/" and "~" inside a key are escaped."""
    return "".join("/" + k.replace("~", "~0").replace("/", "~1") for k in keys)


def fields_patch(body: Mapping[str, Any], spec: Mapping[str, Any],
                 annotations: Mapping[str, str]) -> list[dict[str, Any]]:
    """JSON patch operations that set ``spec`` fields and ``annotations`` on ``body``
    (an object's metadata is always there; its spec or annotations may not be)."""
    meta = body.get("metadata") or {}
    return [*_set_members(body.get("spec"), ("spec",), spec),
            *_set_members(meta.get("annotations"), ("metadata", "annotations"), annotations)]


def _set_members(current: Any, keys: tuple[str, ...],
                 values: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``add`` each member (it replaces one that is there), or the object whole when
    there is none yet."""
    if not values:
        return []
    if isinstance(current, Mapping):
        return [{"op": "add", "path": _pointer(*keys, k), "value": v} for k, v in values.items()]
    return [{"op": "add", "path": _pointer(*keys), "value": dict(values)}]


def managed_configurations(name: str, url: str, ca_bundle: bytes | None
                           ) -> list[dict[str, Any]]:
    """The ValidatingWebhookConfiguration and MutatingWebhookConfiguration named ``name``
    that send GRPOJob writes to the admission server at ``url`` (trusting ``ca_bundle``),
    as the chart's webhook.yaml does through its Service."""
    objects = []
    for webhook in WEBHOOKS:
        client: dict[str, Any] = {"url": f"{url.rstrip('/')}/{webhook.path}"}
        if ca_bundle:
            client["caBundle"] = base64.b64encode(ca_bundle).decode()
        hook: dict[str, Any] = {
            "name": webhook.name, "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "timeoutSeconds": TIMEOUT_SECONDS,
            "matchPolicy": "Equivalent", "clientConfig": client,
            "rules": [{"apiGroups": [API_GROUP], "apiVersions": [API_VERSION],
                       "resources": [PLURAL], "scope": "Namespaced",
                       "operations": list(webhook.operations)}]}
        if webhook.mutating:
            hook["reinvocationPolicy"] = "Never"
        else:
            hook["matchConditions"] = [SPEC_CHANGED]
        objects.append(_configuration(webhook, name, [hook]))
    return objects


def cleared_configurations(name: str) -> list[dict[str, Any]]:
    """The managed configurations with no webhook left: what a stopping operator writes
    (as Kopf did), so that no webhook refuses every GRPOJob write while none answers."""
    return [_configuration(webhook, name, []) for webhook in WEBHOOKS]


def _configuration(webhook: Webhook, name: str,
                   hooks: list[dict[str, Any]]) -> dict[str, Any]:
    kind = ("MutatingWebhookConfiguration" if webhook.mutating
            else "ValidatingWebhookConfiguration")
    return {"apiVersion": WEBHOOK_API, "kind": kind, "metadata": {"name": name},
            "webhooks": hooks}
