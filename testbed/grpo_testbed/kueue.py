"""Kueue in the testbed: the controller as a local process, like KubeRay's.

Outside a cluster its internal certificate management cannot work (it assumes an
in-cluster webhook Service), so it is off: the webhook server gets a certificate from
the testbed's CA, and its webhooks are registered by URL. Only the webhooks for Kueue's
own kinds and for RayClusters are registered (the pinned manifests also name Jobs, Pods,
Deployments... of integrations that are off here, and a Fail policy on those would make
every Pod create depend on Kueue). Integrations: `ray.io/raycluster` only, so a RayCluster
labelled `kueue.x-k8s.io/queue-name` is queued as its own workload.
"""

from __future__ import annotations

import base64
import copy
import logging
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from .pki import issue_serving_cert
from .processes import wait_until
from .versions import bin_dir, binary, component

if TYPE_CHECKING:
    from .launcher import Testbed

log = logging.getLogger("grpo_testbed")

KUEUE_NAMESPACE = "kueue-system"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
_KEEP_PATHS = ("kueue-x-k8s-io", "ray-io-v1-raycluster")


def kueue_config(webhook_port: int, health_port: int, cert_dir: Path) -> dict[str, Any]:
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"port": webhook_port, "host": "127.0.0.1", "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": ["ray.io/raycluster"]},
    }


def webhooks_by_url(manifests: list[dict[str, Any]], base_url: str,
                    ca_bundle: bytes) -> list[dict[str, Any]]:
    """Kueue's webhook configurations with each service reference turned into a URL,
    keeping only the webhooks for Kueue's kinds and RayClusters (pure)."""
    out: list[dict[str, Any]] = []
    for doc in manifests:
        doc = copy.deepcopy(doc)
        kept = []
        for hook in doc.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if not any(k in path for k in _KEEP_PATHS):
                continue
            hook["clientConfig"] = {"url": f"{base_url}{path}",
                                    "caBundle": base64.b64encode(ca_bundle).decode()}
            kept.append(hook)
        doc["webhooks"] = kept
        doc["metadata"] = {"name": f"kueue-{doc['metadata']['name']}"}
        out.append(doc)
    return out


def start_kueue(tb: Testbed) -> None:
    from .launcher import free_ports

    assert tb.pki is not None
    home = bin_dir(component("kueue"))
    crds = sorted((home / "crds").glob("*.yaml"))
    tb.kubectl("apply", "--server-side", "--force-conflicts",
               *(a for f in crds for a in ("-f", str(f))))
    tb.kubectl("wait", "--for", "condition=established", "--timeout=60s",
               "crd/clusterqueues.kueue.x-k8s.io", "crd/workloads.kueue.x-k8s.io")
    tb.kubectl("create", "namespace", KUEUE_NAMESPACE)
    webhook_port, health_port = free_ports(2)
    cert_dir = tb.workdir / "kueue-certs"
    crt, key = issue_serving_cert(tb.pki, cert_dir, "tls", ("127.0.0.1",))
    config = tb.workdir / "kueue.yaml"
    config.write_text(yaml.safe_dump(kueue_config(webhook_port, health_port, cert_dir)))
    del crt, key  # named tls.crt / tls.key in cert_dir, as Kueue expects
    kueue = tb._spawn("kueue", [str(binary("kueue")), "--config", str(config)],
                      env={"KUBECONFIG": str(tb.kubeconfig), "PATH": "/usr/bin:/bin"})
    wait_until("Kueue /readyz", lambda: urllib.request.urlopen(
        f"http://127.0.0.1:{health_port}/readyz", timeout=2).status == 200, 90, [kueue])
    manifests = [d for d in yaml.safe_load_all((home / "webhook" / "manifests.yaml")
                                               .read_text()) if d]
    tb.apply(webhooks_by_url(manifests, f"https://127.0.0.1:{webhook_port}",
                             tb.pki.ca_cert.read_bytes()))
    log.info("Kueue up (webhook https://127.0.0.1:%d)", webhook_port)
