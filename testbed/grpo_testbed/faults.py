"""Fault switches for the testbed's pods: extra env for the containers of pods whose
labels match, e.g. ``GRPO_FAULT_INJECT=leak_host:1024@step=2`` for attempt 0's head
(tiny_job.worker_oom).

A testing aid, never part of the product. On the real node the switch is carried in the
pod spec: the testbed serves a mutating admission webhook of its own (registered by URL
on the host side of the node's veth, where only the testbed listens) that adds the env
to matching pods as they are created, so the real kubelet runs exactly what the API
server stored. Users have no path to it: the operator's webhook still refuses `GRPO_*`
env in `spec.pods`, and this webhook exists only in the testbed.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

log = logging.getLogger("grpo_testbed.faults")

WEBHOOK_NAME = "fault-switch.testbed.grpo.dev"


@dataclass(frozen=True)
class EnvInjection:
    """Extra env for containers of pods carrying all of ``labels`` (fault injection)."""

    labels: dict[str, str]
    env: dict[str, str]


def injected_env(labels: dict[str, str], injections: tuple[EnvInjection, ...]
                 ) -> dict[str, str]:
    """The env of every injection whose labels a pod carries (later ones win)."""
    return {k: v for i in injections
            if all(labels.get(key) == value for key, value in i.labels.items())
            for k, v in i.env.items()}


def env_patch(pod: dict[str, Any], injections: tuple[EnvInjection, ...]) -> list[dict[str, Any]]:
    """JSON Patch adding every matching injection's env to every container (pure)."""
    extra = injected_env(pod.get("metadata", {}).get("labels") or {}, injections)
    if not extra:
        return []
    ops: list[dict[str, Any]] = []
    for n, container in enumerate(pod.get("spec", {}).get("containers") or []):
        entries = [{"name": k, "value": v} for k, v in extra.items()]
        if not container.get("env"):
            ops.append({"op": "add", "path": f"/spec/containers/{n}/env", "value": entries})
        else:
            ops += [{"op": "add", "path": f"/spec/containers/{n}/env/-", "value": e}
                    for e in entries]
    return ops


def review_response(review: dict[str, Any],
                    injections: tuple[EnvInjection, ...]) -> dict[str, Any]:
    request = review.get("request") or {}
    response: dict[str, Any] = {"uid": request.get("uid", ""), "allowed": True}
    ops = env_patch(request.get("object") or {}, injections)
    if ops:
        response |= {"patchType": "JSONPatch",
                     "patch": base64.b64encode(json.dumps(ops).encode()).decode()}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "response": response}


class FaultSwitch:
    """The webhook server and its MutatingWebhookConfiguration (one per testbed)."""

    def __init__(self, injections: tuple[EnvInjection, ...], host: str, cert: Path,
                 key: Path) -> None:
        self.injections = injections
        switch = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                out = json.dumps(review_response(json.loads(body), switch.injections))
                if '"patch"' in out:
                    log.info("fault switch: env added to a pod")
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(out.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, 0), Handler)
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(cert), str(key))
        self.server.socket = ctx.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://{host}:{self.server.server_address[1]}/mutate"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> FaultSwitch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def manifest(self, ca_cert: Path) -> dict[str, Any]:
        """Only pods that carry some injection's labels are sent here at all."""
        return {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": WEBHOOK_NAME},
            "webhooks": [{
                "name": f"{n}.{WEBHOOK_NAME}",
                "clientConfig": {"url": self.url,
                                 "caBundle": base64.b64encode(ca_cert.read_bytes()).decode()},
                "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                           "resources": ["pods"]}],
                "objectSelector": {"matchLabels": i.labels},
                "failurePolicy": "Fail",
                "sideEffects": "None",
                "admissionReviewVersions": ["v1"],
                "timeoutSeconds": 5,
            } for n, i in enumerate(self.injections)],
        }
