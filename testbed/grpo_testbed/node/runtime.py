"""Start and stop the real node: containerd, kubelet, kube-proxy and CoreDNS, each in the
node's network namespace (see network.py), with the product's images imported."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ..leftovers import kill_processes_naming, unmount_under
from ..processes import Managed, free_ports, spawn, wait_until
from ..versions import binary
from .claims import ClaimDirectories
from .config import Allocatable, NodePaths, write_node_config
from .images import ensure_sandbox_image, import_image
from .log_archive import LogArchive
from .network import NodeNetwork
from .oom_group import OomGroupKill
from .store import ImageStore, acquire_store

log = logging.getLogger("grpo_testbed.node")

NODE_NAME = "local-node"


@dataclass
class RealNode:
    """One real node. ``kubectl`` runs against the testbed (for the readiness check);
    ``kubeconfig`` is what the node's programs use to reach the API server, through the
    host side of the node's veth."""

    workdir: Path
    kubeconfig: Path
    ca_cert: Path
    kubectl: Callable[..., subprocess.CompletedProcess[str]]
    images: Sequence[str] = ()
    net: NodeNetwork | None = None
    alloc: Allocatable = field(default_factory=Allocatable)
    # Registries (host:port, plain HTTP) containerd may pull from: the testbed's own.
    registries: tuple[str, ...] = ()
    # An empty image store of this node's own (in its work dir) instead of the shared one
    # that earlier runs filled: what a pod runs then comes from a registry, layer by layer.
    # The shared store's snapshots would let containerd skip every layer it has unpacked
    # (same diff IDs), whatever registry the pod names and even with pullPolicy Always.
    own_store: bool = False
    procs: list[Managed] = field(default_factory=list)
    import_s: dict[str, float] = field(default_factory=dict)
    store: ImageStore | None = None
    claims: ClaimDirectories | None = None
    logs: LogArchive | None = None
    oom_group: OomGroupKill | None = None

    @property
    def paths(self) -> NodePaths:
        assert self.store is not None
        return NodePaths(self.workdir, self.store.path)

    @property
    def log_dir(self) -> Path:
        return self.workdir / "logs"

    def start(self) -> RealNode:
        assert self.net is not None, "allocate the network first (it must exist before the "\
            "API server binds the host side)"
        t0 = time.monotonic()
        kubelet_healthz, proxy_healthz, proxy_metrics = free_ports(3)
        self.store = (ImageStore(self.workdir / "containerd" / "root") if self.own_store
                      else acquire_store(self.workdir))
        sandbox = ensure_sandbox_image()
        write_node_config(self.net, self.paths, ca_cert=self.ca_cert,
                          kubeconfig=self.kubeconfig, node_name=NODE_NAME,
                          sandbox_image=sandbox,
                          ports=(kubelet_healthz, proxy_healthz, proxy_metrics),
                          alloc=self.alloc, registries=self.registries)
        ns = self.net.nsenter()
        containerd = self._spawn("containerd", [
            *ns, str(binary("containerd")), "--config", str(self.paths.containerd_config),
            "--log-level", "warn"])
        wait_until("containerd socket", self.paths.containerd_socket.exists, 30, [containerd])
        for tag in (sandbox, *self.images):
            self.import_s[tag] = import_image(binary("ctr"), self.paths.containerd_socket, tag,
                                            self.workdir)
        kubelet = self._spawn("kubelet", [
            *ns, str(binary("kubelet")),
            "--config", str(self.paths.kubelet_config),
            "--kubeconfig", str(self.kubeconfig),
            "--root-dir", str(self.paths.kubelet_root),
            "--cert-dir", str(self.workdir / "kubelet-pki"),
            "--hostname-override", NODE_NAME,
            "--node-ip", self.net.node_ip,
            "--node-labels", "grpo.dev/testbed-node=real",
            "--v", "1",
        ])
        self._spawn("kube-proxy", [
            *ns, str(binary("kube-proxy")), "--config", str(self.paths.kube_proxy_config)])
        self._spawn("coredns", [
            *ns, str(binary("coredns")), "-conf", str(self.paths.corefile)])

        def ready() -> bool:
            out = self.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
            if out.returncode != 0:
                return False
            conds = json.loads(out.stdout).get("status", {}).get("conditions", [])
            return any(c["type"] == "Ready" and c["status"] == "True" for c in conds)

        wait_until(f"node {NODE_NAME} Ready", ready, 120, [containerd, kubelet])
        self.oom_group = OomGroupKill(self.paths.running_tasks).start()
        self.claims = ClaimDirectories(self.kubectl).start()
        self.logs = LogArchive(self.paths.pod_logs, self.workdir / "log-archive").start()
        log.info("real node %s Ready in %.1f s (%s)", NODE_NAME, time.monotonic() - t0,
                 self.net.node_ip)
        return self

    def stop(self) -> None:
        """The kubelet first (it would restart what goes), then every container through
        containerd, then whatever survived (the shims outlive containerd), then the other
        programs. The network namespace is the testbed's, which created it. The image
        store's lock goes whatever fails before: a lock left held sends every later node
        of the run to a store of its own, a second 14 GB import of the trainer image."""
        try:
            if self.logs is not None:
                self.logs.stop()
            if self.oom_group is not None:
                self.oom_group.stop()
            for p in self.procs:
                if p.name == "kubelet":
                    p.stop()
            if any(p.name == "containerd" and p.alive() for p in self.procs):
                self._forget_containers()  # nor must the next run's kubelet find them
            self._kill_containers()
            for p in reversed(self.procs):
                p.stop()
            self.procs.clear()
            unmount_under(self.workdir)  # the kubelet's and containerd's mounts
            if self.claims is not None:
                self.claims.stop()
        finally:
            if self.store is not None:
                self.store.release()

    def _spawn(self, name: str, argv: list[str]) -> Managed:
        p = spawn(name, argv, self.log_dir, {**os.environ})
        self.procs.append(p)
        return p

    def _kill_containers(self) -> None:
        """Every container's first process (its PID namespace goes with it), then the
        shims, which containerd started in sessions of their own and which outlive it."""
        tasks = self.workdir / "containerd" / "state" / "io.containerd.runtime.v2.task"
        for pidfile in tasks.glob("*/*/init.pid"):
            with contextlib.suppress(ValueError, OSError):
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
        kill_processes_naming(b"containerd-shim",
                              f"-address\0{self.paths.containerd_socket}\0".encode())

    def _forget_containers(self) -> None:
        ctr = [str(binary("ctr")), "--address", str(self.paths.containerd_socket),
               "--namespace", "k8s.io"]
        for kind in ("tasks", "containers"):
            listed = subprocess.run([*ctr, kind, "ls", "-q"], capture_output=True, text=True,
                                    timeout=30, check=False).stdout.split()
            for ident in listed:
                rm = ["kill", "-s", "SIGKILL"] if kind == "tasks" else ["rm"]
                subprocess.run([*ctr, kind, *rm, ident], capture_output=True, timeout=30,
                               check=False)
                if kind == "tasks":
                    subprocess.run([*ctr, kind, "rm", "-f", ident], capture_output=True,
                                   timeout=30, check=False)


