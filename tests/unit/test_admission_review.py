"""The admission webhooks on the wire: the answer the API server reads, the creation
defaults as a JSON patch (applied by an RFC 6902 implementation, Kopf's own dependency),
and the managed configurations beside the chart's."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import pytest

from grpo_operator.admission_review import (
    DEFAULT,
    VALIDATE,
    cleared_configurations,
    fields_patch,
    managed_configurations,
    review_answer,
    webhook_at,
)
from grpo_testbed.chart import objects, render

pytestmark = pytest.mark.unit

REVIEW: dict[str, Any] = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
          "request": {"uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "operation": "CREATE"}}


def test_a_refusal_carries_its_words_and_code_and_echoes_the_uid() -> None:
    answer = review_answer(REVIEW, "spec.resources.gpusPerNode: 9 is more than ...")
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == REVIEW["request"]["uid"] and response["allowed"] is False
    assert response["status"] == {"message": "spec.resources.gpusPerNode: 9 is more than ...",
                                  "code": 422}
    assert "patch" not in response and "warnings" not in response


def test_an_admitted_object_carries_warnings_and_its_patch() -> None:
    ops = [{"op": "add", "path": "/spec/image", "value": "trainer:1"}]
    response = review_answer(REVIEW, warnings=["spec.data.workers is deprecated"],
                             patch=ops)["response"]
    assert response["allowed"] is True and "status" not in response
    assert response["warnings"] == ["spec.data.workers is deprecated"]
    assert response["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(response["patch"])) == ops


@pytest.mark.parametrize("metadata", [
    {"name": "j"},
    {"name": "j", "annotations": {"team": "vision"}},
    {"name": "j", "annotations": {"grpo.dev/inherited": "stale"}},
])
@pytest.mark.parametrize("spec", [None, {}, {"model": {"path": "m"}, "image": "old"}])
def test_the_defaults_patch_sets_exactly_those_fields_whatever_is_there(
        metadata: dict[str, Any], spec: dict[str, Any] | None) -> None:
    body: dict[str, Any] = {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
                            "metadata": metadata}
    if spec is not None:
        body["spec"] = spec
    annotations = {"grpo.dev/inherited": '{"spec.queueName": "jobDefaults"}'}
    patched = jsonpatch.apply_patch(body, fields_patch(
        body, {"image": "trainer:2", "queueName": "team-a"}, annotations))
    assert patched["spec"] == {**(spec or {}), "image": "trainer:2", "queueName": "team-a"}
    assert patched["metadata"] == {**metadata, "annotations": {
        **metadata.get("annotations", {}), **annotations}}
    assert fields_patch(body, {}, {}) == []


def test_webhooks_are_found_by_the_last_segment_of_their_path() -> None:
    assert webhook_at("/validate-grpojob") is VALIDATE
    assert webhook_at("default-grpojob") is DEFAULT
    assert webhook_at("/prefix/validate-grpojob") is VALIDATE
    assert webhook_at("/validate") is None and webhook_at(None) is None


def _by_path(hooks: list[dict[str, Any]], path_of: Any) -> dict[str, dict[str, Any]]:
    return {path_of(h).rsplit("/", 1)[-1]: h for h in hooks}


def test_managed_configurations_send_what_the_charts_send() -> None:
    """--webhook-manage (dev, the testbed) and the chart: the same webhooks, names, paths,
    operations, conditions and policies; only how the server is reached differs."""
    docs = render()
    chart = {kind: _by_path(objects(docs, kind)[0]["webhooks"],
                            lambda h: h["clientConfig"]["service"]["path"])
             for kind in ("ValidatingWebhookConfiguration", "MutatingWebhookConfiguration")}
    ca = b"-----BEGIN CERTIFICATE-----\n...\n"
    managed = {obj["kind"]: _by_path(obj["webhooks"], lambda h: h["clientConfig"]["url"])
               for obj in managed_configurations("grpo.dev", "https://127.0.0.1:9443", ca)}
    assert managed.keys() == chart.keys()
    for kind, hooks in managed.items():
        assert hooks.keys() == chart[kind].keys()
        for path, hook in hooks.items():
            theirs = chart[kind][path]
            assert hook["clientConfig"] == {"url": f"https://127.0.0.1:9443/{path}",
                                            "caBundle": base64.b64encode(ca).decode()}
            for key in ("name", "rules", "matchConditions", "sideEffects", "failurePolicy",
                        "matchPolicy", "admissionReviewVersions", "reinvocationPolicy"):
                assert hook.get(key) == theirs.get(key), (kind, path, key)
    cleared = cleared_configurations("grpo.dev")  # what a stopping operator writes
    assert [(o["kind"], o["metadata"]["name"], o["webhooks"]) for o in cleared] == [
        (kind, "grpo.dev", []) for kind in managed]
