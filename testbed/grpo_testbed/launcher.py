"""Start and stop a real Kubernetes control plane on 127.0.0.1.

etcd, kube-apiserver (RBAC, generated certificates and service-account keys),
kube-controller-manager, kube-scheduler, kwok (fake GPU nodes), the KubeRay
operator and an image registry (registry.py), each on a free port, in one temp dir,
with an admin kubeconfig.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import IO, Any

import yaml

from . import build, leftovers
from .faults import EnvInjection, FaultSwitch
from .images import REPO
from .kueue import start_kueue
from .node.network import NodeNetwork, allocate
from .node.runtime import RealNode
from .nodes import FAKE_NODES, FakeNode, node_manifest
from .pki import SERVICE_CLUSTER_IP_RANGE, Pki, issue_serving_cert, make_pki
from .processes import Managed, free_ports, spawn, wait_until
from .registry import Registry, start_registry
from .s3_server import S3Server, start_s3_server
from .versions import COMPONENTS, bin_dir, binary, component

GRPOJOB_CRD = REPO / "crds" / "grpojob.yaml"

log = logging.getLogger("grpo_testbed")


def write_kubeconfig(path: Path, server: str, ca: Path, *, cert: Path | None = None,
                     key: Path | None = None, token: str | None = None,
                     user: str = "admin") -> Path:
    user_entry: dict[str, str] = {}
    if cert and key:
        user_entry = {"client-certificate": str(cert), "client-key": str(key)}
    if token:
        user_entry = {"token": token}
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "testbed",
                      "cluster": {"server": server, "certificate-authority": str(ca)}}],
        "users": [{"name": user, "user": user_entry}],
        "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": user}}],
        "current-context": "testbed",
    }
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path


@dataclass
class Testbed:
    """A running control plane. Use :func:`running_testbed` or ``start()``/``stop()``."""

    __test__ = False  # not a pytest test class, despite the name

    workdir: Path
    # Only etcd and kube-apiserver: enough to see an operator reconcile (status written,
    # children created), started in a few seconds (the repeated-start test starts dozens).
    bare: bool = False
    # etcd's data directory of an earlier testbed to start from (a copy): its objects,
    # e.g. CRDs, exist before this API server starts (force-new-cluster: one member).
    etcd_seed: Path | None = None
    with_kuberay: bool = True
    # Kueue (kueue.py), admitting RayClusters labelled with a queue; needs KubeRay's CRDs.
    with_kueue: bool = True
    # An OCI registry (registry.py) that podman pushes to and the real node pulls from.
    with_registry: bool = True
    # A registry store kept between runs (registry.py, ``start_registry``), else its own.
    registry_store: Path | None = None
    # An S3 server (s3_server.py) on the API server's address: the host and the real
    # node's pods reach it there.
    with_s3: bool = True
    procs: list[Managed] = field(default_factory=list)
    api_port: int = 0
    pki: Pki | None = None
    fake_nodes: tuple[FakeNode, ...] = FAKE_NODES
    # The fault switch (faults.py): env its webhook adds to pods whose labels match.
    injections: tuple[EnvInjection, ...] = ()
    # A real kubelet on containerd in a network namespace of its own (node/), running
    # pods from these images (podman tags, imported into its containerd).
    real_node: bool = False
    node_images: tuple[str, ...] = ()
    # The real node starts with an empty image store of its own, not the shared one: its
    # pods' images must come from the registry (see RealNode.own_store).
    own_image_store: bool = False
    node: RealNode | None = None
    image_registry: Registry | None = None
    s3: S3Server | None = None
    fault_switch: FaultSwitch | None = None
    net: NodeNetwork | None = None
    _owns_workdir: bool = False
    _owner: IO[bytes] | None = field(default=None, repr=False)

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def api_host(self) -> str:
        """Where the API server listens: the host side of the real node's veth when there
        is one (the node and its pods reach it there), else loopback."""
        return self.net.host_ip if self.net is not None else "127.0.0.1"

    @property
    def server(self) -> str:
        return f"https://{self.api_host}:{self.api_port}"

    @property
    def registry(self) -> str:
        """``host:port`` of the testbed's image registry (plain HTTP): on the API server's
        address, where podman on the host and the real node's containerd both reach it.
        Push with :func:`grpo_testbed.registry.push_image`."""
        if self.image_registry is None:
            raise RuntimeError(
                "this testbed runs no registry: it starts with every testbed but a bare one; "
                "start it without bare=True and with with_registry=True")
        return self.image_registry.address

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    def env(self) -> dict[str, str]:
        """Environment for tools: KUBECONFIG and the testbed binaries first on PATH."""
        path = os.pathsep.join(str(bin_dir(c)) for c in COMPONENTS)
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig),
                "PATH": path + os.pathsep + os.environ.get("PATH", "")}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout: float = 120) -> subprocess.CompletedProcess[str]:
        argv = [str(binary("kubectl")), "--kubeconfig", str(self.kubeconfig), *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise subprocess.CalledProcessError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    def get_json(self, *args: str) -> Any:
        """`kubectl get ARGS -o json`, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def helm(self, *args: str, check: bool = True,
             timeout: float = 300) -> subprocess.CompletedProcess[str]:
        """The pinned helm against this testbed (its KUBECONFIG and binaries); a failure
        raises with helm's own output unless ``check`` is off."""
        proc = subprocess.run([str(binary("helm")), *args], env=self.env(),
                              capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed ({proc.returncode}):\n"
                               f"{proc.stdout}\n{proc.stderr}")
        return proc

    def apply(self, manifest: dict[str, Any] | list[dict[str, Any]] | str,
              server_side: bool = False) -> None:
        docs = manifest if isinstance(manifest, str) else yaml.safe_dump_all(
            manifest if isinstance(manifest, list) else [manifest])
        args = ["apply", "-f", "-"] + (["--server-side", "--force-conflicts"] if server_side
                                       else [])
        self.kubectl(*args, input=docs)

    def wait_established(self, what: str, crds: tuple[str, ...], timeout_s: float = 90) -> None:
        """Wait for CRDs just applied. `kubectl wait` right after a server-side apply can
        answer NotFound (seen for KubeRay's and Kueue's large CRDs while they are being
        stored), so it is asked again until they are established."""
        wait_until(f"{what} CRDs established", lambda: self.kubectl(
            "wait", "--for", "condition=established", "--timeout=10s",
            *(f"crd/{c}" for c in crds), check=False).returncode == 0, timeout_s)

    def install_grpojob_crd(self) -> None:
        """Apply the product's CRD (crds/grpojob.yaml) and wait until it is established.
        A bare `kubectl wait` right after the apply can answer NotFound and fail at once
        (seen in a full run), so this asks again as `wait_established` does."""
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f",
                     str(GRPOJOB_CRD))
        self.wait_established("GRPOJob", ("grpojobs.grpo.dev",))

    def token_kubeconfig(self, account: str, namespace: str, path: Path,
                         duration: str = "60m") -> Path:
        """A kubeconfig that acts as a ServiceAccount (a fresh bound token)."""
        token = self.kubectl("create", "token", account, "-n", namespace,
                             f"--duration={duration}").stdout.strip()
        assert self.pki is not None
        return write_kubeconfig(path, self.server, self.pki.ca_cert, token=token, user=account)

    def namespace(self, prefix: str = "t") -> str:
        """Create a fresh namespace (and wait for its default ServiceAccount)."""
        name = f"{prefix}-{os.urandom(3).hex()}"
        self.kubectl("create", "namespace", name)
        wait_until(f"ServiceAccount default in {name}",
                   lambda: self.kubectl("get", "sa", "default", "-n", name, check=False)
                   .returncode == 0, 30)
        return name

    # ---- lifecycle -------------------------------------------------------------

    def not_run(self) -> frozenset[str]:
        """The components this testbed does not start, so need not be built."""
        return frozenset(
            ({"kueue"} if not (self.with_kuberay and self.with_kueue) else set())
            | ({"registry"} if not self.with_registry else set())
            | ({"versitygw"} if not self.with_s3 else set()))

    def start(self) -> Testbed:
        t0 = time.monotonic()
        # Before anything else: a dead run's work directory may hold the disk space that
        # this run's image import needs.
        leftovers.sweep()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._owner = leftovers.hold(self.workdir)
        skipped = self.not_run()
        missing = [c.name for c in COMPONENTS
                   if c.name not in skipped and not build.is_built(c)]
        if missing:
            log.info("building testbed components %s (cold build: tens of minutes)", missing)
            build.build_all(missing)
        try:
            if self.real_node:  # before the API server, which listens on its host side
                self.net = allocate()
            self._start_control_plane()
            if self.bare:
                log.info("bare control plane up in %.1f s: %s", time.monotonic() - t0,
                         self.server)
                return self
            if self.with_registry:  # before the node, whose containerd is told about it
                self.image_registry = start_registry(self.api_host, self.workdir / "registry",
                                                     self.spawn, self.registry_store)
            if self.with_s3:
                self.s3 = start_s3_server(self.api_host, self.workdir / "s3", self.spawn)
            self._start_controllers()
            self._start_kwok()
            self._install_monitoring_crds()
            if self.with_kuberay:
                self._start_kuberay()
                if self.with_kueue:
                    start_kueue(self)
            if self.real_node and self.injections:
                self._start_fault_switch()
            if self.real_node:
                assert self.pki is not None and self.net is not None
                self.node = RealNode(
                    self.workdir / "node", self.kubeconfig, self.pki.ca_cert, self.kubectl,
                    self.node_images, self.net,
                    registries=(self.registry,) if self.image_registry else (),
                    own_store=self.own_image_store)
                self.node.start()
        except BaseException:
            self.stop()
            raise
        log.info("testbed up in %.1f s: %s (kubeconfig %s%s)", time.monotonic() - t0,
                 self.server, self.kubeconfig,
                 f", registry {self.registry}" if self.image_registry else "")
        return self

    def stop(self) -> None:
        if self.node is not None:  # containers before the API server goes
            self.node.stop()
            self.node = None
        if self.fault_switch is not None:
            self.fault_switch.stop()
            self.fault_switch = None
        for p in reversed(self.procs):
            p.stop()
        self.procs.clear()
        if self.image_registry is not None:
            self.image_registry.close()
        self.image_registry = None  # its process was one of procs; its store goes with workdir
        if self.net is not None:
            self.net.delete()
            self.net = None
        if self._owns_workdir and not os.environ.get("GRPO_TESTBED_KEEP"):
            shutil.rmtree(self.workdir, ignore_errors=True)
        if self._owner is not None:
            self._owner.close()
            self._owner = None

    def __enter__(self) -> Testbed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def restart(self, name: str) -> None:
        """Stop one component and start it again with the same flags (same port and
        data), e.g. to check that clients survive an API-server restart."""
        i, old = next((i, p) for i, p in enumerate(self.procs) if p.name == name)
        old.stop()
        self.procs[i] = spawn(name, old.argv, self.log_dir, old.env)
        if name == "kube-apiserver":
            wait_until("kube-apiserver back", lambda: self.kubectl(
                "get", "--raw", "/readyz", check=False).returncode == 0, 90, [self.procs[i]])

    def _start_fault_switch(self) -> None:
        """The injections as a mutating webhook (faults.py): a real kubelet injects nothing."""
        assert self.pki is not None
        cert, key = issue_serving_cert(self.pki, self.workdir / "fault-switch", "fault-switch",
                                       (self.api_host,))
        self.fault_switch = FaultSwitch(self.injections, self.api_host, cert, key).start()
        self.apply(self.fault_switch.manifest(self.pki.ca_cert))

    def spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Managed:
        """A process of the testbed's: logged to its log dir, stopped with it."""
        p = spawn(name, argv, self.log_dir, env)
        self.procs.append(p)
        return p

    def _start_control_plane(self) -> None:
        etcd_port, peer_port, self.api_port = free_ports(3)
        self.pki = pki = make_pki(self.workdir / "pki",
                                  (self.net.host_ip,) if self.net is not None else ())
        write_kubeconfig(self.kubeconfig, self.server, pki.ca_cert,
                         cert=pki.admin_cert, key=pki.admin_key)
        seeded = []
        if self.etcd_seed is not None:
            shutil.copytree(self.etcd_seed, self.workdir / "etcd")
            seeded = ["--force-new-cluster"]
        etcd = self.spawn("etcd", [
            str(binary("etcd")), "--name", "testbed", *seeded,
            "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"testbed=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync",  # a throwaway store; fsync only slows tests down
            "--log-level", "warn",
        ])
        wait_until("etcd health", lambda: json.loads(urllib.request.urlopen(
            f"http://127.0.0.1:{etcd_port}/health", timeout=2).read())["health"] == "true",
                   30, [etcd])
        api = self.spawn("kube-apiserver", [
            str(binary("kube-apiserver")),
            "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
            "--bind-address", self.api_host, "--advertise-address", self.api_host,
            # kubectl logs/exec: the kubelet trusts the testbed CA's admin certificate.
            "--kubelet-client-certificate", str(pki.admin_cert),
            "--kubelet-client-key", str(pki.admin_key),
            # Never the node's host name: resolving it would ask the machine's resolver.
            "--kubelet-preferred-address-types", "InternalIP",
            # Webhooks are called at their pods' addresses (no kube-proxy on the host).
            "--enable-aggregator-routing=true",
            "--secure-port", str(self.api_port),
            "--tls-cert-file", str(pki.apiserver_cert),
            "--tls-private-key-file", str(pki.apiserver_key),
            "--client-ca-file", str(pki.ca_cert),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-account-key-file", str(pki.sa_pub),
            "--service-account-signing-key-file", str(pki.sa_key),
            "--service-cluster-ip-range", SERVICE_CLUSTER_IP_RANGE,
            "--authorization-mode", "RBAC",
            "--allow-privileged=true",
            "--profiling=false",
            "--cert-dir", str(self.workdir / "apiserver-certs"),
        ])
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ctx.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
        wait_until("kube-apiserver /readyz", lambda: urllib.request.urlopen(
            f"{self.server}/readyz", context=ctx, timeout=5).read() == b"ok", 90, [etcd, api])

    def _start_controllers(self) -> None:
        kcm_port, sched_port = free_ports(2)
        pki = self.pki
        assert pki is not None
        common = ["--kubeconfig", str(self.kubeconfig),
                  "--authentication-kubeconfig", str(self.kubeconfig),
                  "--authorization-kubeconfig", str(self.kubeconfig),
                  "--leader-elect=false", "--bind-address", "127.0.0.1"]
        self.spawn("kube-controller-manager", [
            str(binary("kube-controller-manager")), *common,
            "--secure-port", str(kcm_port),
            "--cert-dir", str(self.workdir / "kcm-certs"),
            "--service-account-private-key-file", str(pki.sa_key),
            "--root-ca-file", str(pki.ca_cert),
            "--cluster-signing-cert-file", str(pki.ca_cert),
            "--cluster-signing-key-file", str(pki.ca_key),
            "--service-cluster-ip-range", SERVICE_CLUSTER_IP_RANGE,
            "--concurrent-gc-syncs", "10",
        ])
        self.spawn("kube-scheduler", [
            str(binary("kube-scheduler")), *common,
            "--secure-port", str(sched_port),
            "--cert-dir", str(self.workdir / "scheduler-certs"),
        ])
        wait_until("the default ServiceAccount (controller-manager up)",
                   lambda: self.kubectl("get", "sa", "default", check=False).returncode == 0,
                   60, self.procs)

    def _kwok_config(self) -> Path:
        stages = sorted((bin_dir(component("kwok")) / "stages").glob("*.yaml"))
        # Stages only: a KwokConfiguration document would reset kwok's defaults (its
        # parallelism options) to zero; the options go on the command line instead.
        docs: list[dict[str, Any]] = []
        other: list[dict[str, Any]] = []
        for f in stages:
            for doc in yaml.safe_load_all(f.read_text()):
                (docs if doc and doc.get("kind") == "Stage" else other).append(doc)
        chaos = resources.files("grpo_testbed").joinpath("config/kwok-chaos.yaml").read_text()
        docs += [d for d in yaml.safe_load_all(chaos) if d]
        path = self.workdir / "kwok.yaml"
        path.write_text(yaml.safe_dump_all(docs))
        if other:  # e.g. the StorageClass that the volume stages provision for
            self.apply(other)
        return path

    def _start_kwok(self) -> None:
        config = self._kwok_config()
        self.apply([node_manifest(n) for n in self.fake_nodes])
        names = {n.name for n in self.fake_nodes}

        def nodes_ready() -> bool:
            out = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)
            ready = {
                i["metadata"]["name"] for i in out["items"]
                if any(c["type"] == "Ready" and c["status"] == "True"
                       for c in i.get("status", {}).get("conditions", []))
            }
            return names <= ready

        # kwok v0.8.0 sometimes panics while it registers its CEL types at start-up
        # (seen once in easycel's registerTraits, never after it is up): start it again.
        for tries_left in (2, 1, 0):
            (server_port,) = free_ports(1)
            kwok = self.spawn("kwok", [
                str(binary("kwok")), "--kubeconfig", str(self.kubeconfig),
                "--config", str(config),
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake",
                "--cidr", "10.244.0.0/16", "--node-ip", "10.240.0.1",
                "--server-address", f"127.0.0.1:{server_port}",
            ])
            try:
                wait_until("fake nodes Ready", nodes_ready, 60, [kwok])
                return
            except RuntimeError:  # it exited
                if not tries_left or "panic" not in kwok.log_tail(200):
                    raise
                log.warning("kwok panicked at start-up; starting it again:\n%s",
                            kwok.log_tail(5))
                self.procs.remove(kwok)

    def _install_monitoring_crds(self) -> None:
        """The Prometheus Operator's PodMonitor and ServiceMonitor CRDs, as a cluster with
        kube-prometheus has them: the chart's monitors are checked against their schemas."""
        crds = sorted((bin_dir(component("prometheus-crds")) / "crds").glob("*.yaml"))
        self.kubectl("apply", "--server-side", "--force-conflicts",
                     *(a for f in crds for a in ("-f", str(f))))
        self.wait_established("the Prometheus Operator's", (
            "podmonitors.monitoring.coreos.com", "servicemonitors.monitoring.coreos.com"))

    def _start_kuberay(self) -> None:
        crds = sorted((bin_dir(component("kuberay")) / "crds").glob("*.yaml"))
        # KubeRay's CRDs exceed the client-side apply annotation limit.
        self.kubectl("apply", "--server-side", "--force-conflicts",
                     *(a for f in crds for a in ("-f", str(f))))
        self.wait_established("KubeRay", ("rayclusters.ray.io", "rayjobs.ray.io",
                                          "rayservices.ray.io"))
        metrics_port, probe_port = free_ports(2)
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        kuberay = self.spawn("kuberay-operator", [
            str(binary("kuberay-operator")),
            "--enable-leader-election=false",
            "--metrics-addr", f"127.0.0.1:{metrics_port}",
            "--health-probe-bind-address", f"127.0.0.1:{probe_port}",
            "--log-stdout-encoder", "console",
        ], env=env)
        wait_until("KubeRay operator /readyz", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{probe_port}/readyz", timeout=2).status == 200, 60, [kuberay])


@contextmanager
def running_testbed(workdir: Path | None = None, with_kuberay: bool = True,
                    with_kueue: bool = True,
                    injections: tuple[EnvInjection, ...] = (),
                    real_node: bool = False,
                    node_images: tuple[str, ...] = (),
                    with_registry: bool = True,
                    with_s3: bool = True,
                    own_image_store: bool = False,
                    registry_store: Path | None = None) -> Iterator[Testbed]:
    """A started testbed that is stopped (and its temp dir removed) on exit.

    With ``real_node`` the untainted fake CPU node is left out, so CPU-only pods land
    on the real node and really run; ``injections`` need it (the fault switch's webhook
    listens where the real node's network meets the host). ``own_image_store`` gives the
    real node an empty image store, so its pods' images come from the registry.
    """
    if injections and not real_node:
        raise ValueError("the fault switch's injections need real_node=True")
    if own_image_store and not real_node:
        raise ValueError("own_image_store is the real node's store: it needs real_node=True")
    owns = workdir is None
    wd = Path(tempfile.mkdtemp(prefix=leftovers.PREFIX)) if workdir is None else workdir
    wd.mkdir(parents=True, exist_ok=True)
    nodes = tuple(n for n in FAKE_NODES if n.gpu_type) if real_node else FAKE_NODES
    tb = Testbed(workdir=wd, with_kuberay=with_kuberay, with_kueue=with_kueue,
                 fake_nodes=nodes,
                 injections=injections, real_node=real_node,
                 node_images=node_images, with_registry=with_registry, with_s3=with_s3,
                 own_image_store=own_image_store, registry_store=registry_store,
                 _owns_workdir=owns)
    with tb:
        yield tb
