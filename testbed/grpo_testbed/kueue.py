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
import subprocess
import urllib.request
from pathlib import Path
from typing import Any, Protocol

import yaml

from grpo_api.catalog import GPU_CATALOG
from grpo_operator.kueue_flavors import resource_flavors

from .pki import Pki, issue_serving_cert
from .processes import Managed, free_ports, wait_until
from .versions import bin_dir, binary, component

log = logging.getLogger("grpo_testbed")

KUEUE_NAMESPACE = "kueue-system"
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


# Where Kueue v0.16 reads its metrics certificate when its internal certificate
# management is off (hard-coded in cmd/kueue/main.go; it exits without one).
METRICS_CERT_DIR = "/etc/kueue/metrics/certs"


def in_private_etc(scratch: Path, cert_dir: Path, argv: list[str]) -> list[str]:
    """`argv` run in a mount namespace of its own whose /etc is an overlay holding
    METRICS_CERT_DIR (our certificate): the machine's /etc is never written."""
    upper, work = scratch / "upper", scratch / "work"
    upper.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    script = (f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} "
              f"/etc && mkdir -p {Path(METRICS_CERT_DIR).parent} && "
              f"ln -s {cert_dir} {METRICS_CERT_DIR} && exec \"$@\"")
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "kueue",
            *argv]


class ControlPlane(Protocol):
    """What Kueue's start needs of the running control plane (launcher.Testbed is one):
    named here, so that this module does not import the launcher that starts it."""

    workdir: Path
    pki: Pki | None

    @property
    def kubeconfig(self) -> Path: ...

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]: ...

    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]] | str,
              server_side: bool = False) -> None: ...

    def wait_established(self, what: str, crds: tuple[str, ...],
                         timeout_s: float = 90) -> None: ...

    def spawn(self, name: str, argv: list[str],
              env: dict[str, str] | None = None) -> Managed: ...


def start_kueue(tb: ControlPlane) -> None:
    assert tb.pki is not None
    home = bin_dir(component("kueue"))
    crds = sorted((home / "crds").glob("*.yaml"))
    tb.kubectl("apply", "--server-side", "--force-conflicts",
               *(a for f in crds for a in ("-f", str(f))))
    tb.wait_established("Kueue", tuple(
        f"{f.name.split('_', 1)[1].removesuffix('.yaml')}.kueue.x-k8s.io" for f in crds))
    tb.kubectl("create", "namespace", KUEUE_NAMESPACE)
    webhook_port, health_port = free_ports(2)
    cert_dir = tb.workdir / "kueue-certs"
    crt, key = issue_serving_cert(tb.pki, cert_dir, "tls", ("127.0.0.1",))
    config = tb.workdir / "kueue.yaml"
    config.write_text(yaml.safe_dump(kueue_config(webhook_port, health_port, cert_dir)))
    del crt, key  # named tls.crt / tls.key in cert_dir, as Kueue expects
    kueue = tb.spawn("kueue", in_private_etc(tb.workdir / "kueue-etc", cert_dir, [
        # The on-demand visibility API server wants certificates at /visibility and an
        # APIService; pending workloads are read from their own status here.
        str(binary("kueue")), "--config", str(config),
        "--feature-gates", "VisibilityOnDemand=false"]),
                      env={"KUBECONFIG": str(tb.kubeconfig), "PATH": "/usr/bin:/bin"})
    wait_until("Kueue /readyz", lambda: urllib.request.urlopen(
        f"http://127.0.0.1:{health_port}/readyz", timeout=2).status == 200, 90, [kueue])
    manifests = [d for d in yaml.safe_load_all((home / "webhook" / "manifests.yaml")
                                               .read_text()) if d]
    tb.apply(webhooks_by_url(manifests, f"https://127.0.0.1:{webhook_port}",
                             tb.pki.ca_cert.read_bytes()))
    # One ResourceFlavor per GPU type of the built-in catalog, as `grpo kueue-flavors`
    # prints them (docs/kueue.md); ClusterQueues are the tests' and the user's.
    tb.apply(resource_flavors(GPU_CATALOG))
    log.info("Kueue up (webhook https://127.0.0.1:%d), a ResourceFlavor per GPU type",
             webhook_port)
