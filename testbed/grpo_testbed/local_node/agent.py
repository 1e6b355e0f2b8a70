"""The local node agent: a kubelet for one node, running pods as local processes.

kwok runs pods in name only; pods bound to this agent's node really run: each
container's command with the pod's env, its ConfigMap and projected volumes written
to disk, claims as per-claim directories, all bind-mounted in a private mount
namespace, inside a memory cgroup with the container's limit. The agent writes pod
status like a kubelet (Running, then Terminated with exit code, OOMKilled when the
kernel killed for the limit, and the termination message), keeps its Node Ready and
its Lease fresh, and honours deletion (SIGTERM, grace, SIGKILL of the whole cgroup).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException

from ..faults import EnvInjection, injected_env
from ..versions import KUBERNETES_VERSION
from . import podspec, sandbox
from .cgroup import MemoryCgroup

log = logging.getLogger("grpo_testbed.local_node")

LOCAL_NODE = "local-0"
POD_IP = "127.0.0.1"
HEARTBEAT_S = 10.0
SA_AUDIENCE = "https://kubernetes.default.svc.cluster.local"
# Testbed fault injection, like kwok's chaos stage but for real processes: extra env
# for containers of pods whose labels match (see docs/testbed.md).
INJECT_LABEL_PREFIX = "grpo.dev/"


@dataclass
class RunningPod:
    uid: str
    namespace: str
    name: str
    dir: Path
    cgroups: list[MemoryCgroup] = field(default_factory=list)
    stopping: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


class LocalNodeAgent:
    def __init__(self, kubeconfig: Path, workdir: Path, api_port: int, ca_cert: Path,
                 node: str = LOCAL_NODE, injections: tuple[EnvInjection, ...] = ()) -> None:
        sandbox.require_tools()
        self.node = node
        self.workdir = workdir
        self.api_port = api_port
        self.ca_cert = ca_cert
        self.injections = injections
        self.api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        self.coord = client.CoordinationV1Api(self.api.api_client)
        self.pods: dict[str, RunningPod] = {}
        self._lock = threading.Lock()
        self._slot = threading.Lock()  # one running pod at a time, see _run_pod
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # ---- lifecycle ---------------------------------------------------------------

    def start(self) -> LocalNodeAgent:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._register_node()
        for target in (self._heartbeat_loop, self._watch_loop):
            t = threading.Thread(target=target, name=f"local-node-{target.__name__}",
                                 daemon=True)
            t.start()
            self._threads.append(t)
        log.info("local node %s ready (pods run as processes under %s)", self.node,
                 self.workdir)
        return self

    def stop(self) -> None:
        """Every pod's processes die before this returns (the daemons Ray starts, too)."""
        self._stop.set()
        with self._lock:
            running = list(self.pods.values())
        for rp in running:
            rp.stopping.set()
        for rp in running:
            self._terminate(rp, grace_s=2.0)
        for rp in running:
            if rp.thread:
                rp.thread.join(15)
            for cg in rp.cgroups:
                cg.remove()

    # ---- the node ------------------------------------------------------------------

    def _register_node(self) -> None:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        manifest: Any = podspec.local_node_manifest(self.node, os.cpu_count() or 1, mem,
                                               KUBERNETES_VERSION)
        try:
            self.api.create_node(manifest)
        except ApiException as err:
            if err.status != 409:
                raise
        self._heartbeat()

    def _heartbeat(self) -> None:
        now = podspec.now_iso()
        self.api.patch_node_status(self.node, {"status": podspec.node_ready_status(now)})
        micro = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": self.node, "leaseDurationSeconds": 40, "renewTime": micro}
        try:
            self.coord.patch_namespaced_lease(self.node, "kube-node-lease", {"spec": spec})
        except ApiException as err:
            if err.status != 404:
                raise
            body: Any = {"metadata": {"name": self.node}, "spec": spec}
            self.coord.create_namespaced_lease("kube-node-lease", body)

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                self._heartbeat()
            except Exception as err:  # the API server may be restarting; try again
                log.warning("node heartbeat failed: %s", err)

    # ---- pods ------------------------------------------------------------------------

    def _watch_loop(self) -> None:
        selector = f"spec.nodeName={self.node}"
        while not self._stop.is_set():
            try:
                listed = self.api.list_pod_for_all_namespaces(field_selector=selector)
                for pod in listed.items:
                    self._on_pod(self.api.api_client.sanitize_for_serialization(pod))
                w = watch.Watch()
                for ev in w.stream(self.api.list_pod_for_all_namespaces,
                                   field_selector=selector, timeout_seconds=60,
                                   resource_version=(listed.metadata or client.V1ListMeta())
                                   .resource_version):
                    if self._stop.is_set():
                        w.stop()
                        break
                    pod = self.api.api_client.sanitize_for_serialization(ev["object"])
                    if ev["type"] == "DELETED":
                        self._on_gone(pod["metadata"]["uid"])
                    else:
                        self._on_pod(pod)
            except Exception as err:
                if not self._stop.is_set():
                    log.warning("pod watch restarts after: %s", err)
                    time.sleep(1)

    def _on_pod(self, pod: dict[str, Any]) -> None:
        meta = pod["metadata"]
        uid = meta["uid"]
        with self._lock:
            known = self.pods.get(uid)
        if meta.get("deletionTimestamp"):
            if known is not None:
                grace = meta.get("deletionGracePeriodSeconds") or 30
                self._kill(known, grace_s=min(float(grace), 10.0))
            else:
                self._finalise_delete(meta["namespace"], meta["name"], uid)
            return
        if known is not None or pod.get("status", {}).get("phase") in ("Succeeded", "Failed"):
            return
        rp = RunningPod(uid, meta["namespace"], meta["name"],
                        self.workdir / "pods" / f"{meta['namespace']}_{meta['name']}_{uid[:8]}")
        rp.thread = threading.Thread(target=self._run_pod, args=(rp, pod),
                                     name=f"pod-{meta['name']}", daemon=True)
        with self._lock:
            self.pods[uid] = rp
        rp.thread.start()

    def _on_gone(self, uid: str) -> None:
        with self._lock:
            rp = self.pods.get(uid)
        if rp is not None:
            self._kill(rp, grace_s=0)

    def _kill(self, rp: RunningPod, grace_s: float) -> None:
        """A deleted pod: stop its processes (in the background), then remove the object."""
        if rp.stopping.is_set():
            return
        rp.stopping.set()

        def kill() -> None:
            self._terminate(rp, grace_s)
            if rp.thread:
                rp.thread.join(30)
            self._finalise_delete(rp.namespace, rp.name, rp.uid)

        threading.Thread(target=kill, daemon=True).start()

    @staticmethod
    def _terminate(rp: RunningPod, grace_s: float) -> None:
        """SIGTERM everything in the pod's cgroups, SIGKILL what is left after the grace."""
        for cg in list(rp.cgroups):
            cg.kill_all(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while any(cg.pids() for cg in list(rp.cgroups)) and time.monotonic() < deadline:
            time.sleep(0.2)
        for cg in list(rp.cgroups):
            cg.kill_all(signal.SIGKILL)

    def _finalise_delete(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's last word: remove the pod object once its processes are gone."""
        with contextlib.suppress(ApiException):
            self.api.delete_namespaced_pod(
                name, namespace, grace_period_seconds=0,
                body=client.V1DeleteOptions(grace_period_seconds=0,
                                            preconditions=client.V1Preconditions(uid=uid)))
        with self._lock:
            self.pods.pop(uid, None)

    def _patch_status(self, rp: RunningPod, status: dict[str, Any]) -> None:
        try:
            self.api.patch_namespaced_pod_status(rp.name, rp.namespace, {"status": status})
        except ApiException as err:
            if err.status != 404:
                log.warning("status of %s/%s not written: %s", rp.namespace, rp.name, err.reason)

    def _run_pod(self, rp: RunningPod, pod: dict[str, Any]) -> None:
        start_time = podspec.now_iso()
        try:
            plans = self._prepare(rp, pod)
        except podspec.PodSpecError as err:
            log.warning("pod %s/%s cannot run here: %s", rp.namespace, rp.name, err)
            self._patch_status(rp, podspec.failed_to_start(pod, POD_IP, err, start_time))
            return
        # Pods here share the host's network, like hostNetwork pods: two Ray heads
        # would collide on their ports. So one pod runs at a time; the next waits
        # (Pending, ContainerCreating) until the last one's processes are all gone.
        while not self._slot.acquire(timeout=0.5):
            if rp.stopping.is_set():
                return
        try:
            self._run_containers(rp, pod, plans, start_time)
        finally:
            self._slot.release()

    def _run_containers(self, rp: RunningPod, pod: dict[str, Any],
                        plans: list[podspec.ContainerPlan], start_time: str) -> None:
        states: dict[str, dict[str, Any]] = {}
        ids: dict[str, str] = {}
        procs = []
        for plan in plans:
            if rp.stopping.is_set():  # deleted while waiting or preparing: never start
                break
            cg = MemoryCgroup(f"grpo-{rp.uid[:13]}-{plan.name}", plan.memory_limit)
            rp.cgroups.append(cg)
            cdir = rp.dir / "containers" / plan.name
            log_path = rp.dir / f"{plan.name}.log"
            proc, term = sandbox.launch(plan, cdir, cg.procs_file, log_path)
            if rp.stopping.is_set():  # a deletion raced the launch
                cg.kill_all()
            cid = f"local://{proc.pid}"
            states[plan.name] = {"running": {"startedAt": podspec.now_iso()}}
            ids[plan.name] = cid
            procs.append((plan, cg, proc, term, log_path, cid))
            log.info("pod %s/%s container %s: pid %d, memory limit %s, log %s", rp.namespace,
                     rp.name, plan.name, proc.pid, plan.memory_limit, log_path)
        self._patch_status(rp, podspec.pod_status(pod, POD_IP, states, podspec.now_iso(),
                                                  start_time, ids))
        for plan, cg, proc, term, log_path, cid in procs:
            rc = proc.wait()
            oom, peak = cg.oom_kills() > 0, cg.peak_bytes()
            cg.remove()  # daemons the container left behind die with it, as in a runtime
            tail = log_path.read_text(errors="replace")[-16384:] if log_path.exists() else ""
            states[plan.name] = {"terminated": podspec.terminated_state(
                rc, oom, term.read_text(errors="replace") if term.exists() else "", tail,
                plan.fallback_to_logs, states[plan.name]["running"]["startedAt"],
                podspec.now_iso(), cid)}
            log.info("pod %s/%s container %s exited %d%s (peak %.0f MiB)", rp.namespace,
                     rp.name, plan.name, podspec.exit_code_of(rc), " OOMKilled" if oom else "",
                     peak / 2**20)
        self._patch_status(rp, podspec.pod_status(pod, POD_IP, states, podspec.now_iso(),
                                                  start_time, ids))

    # ---- volumes ---------------------------------------------------------------------

    def _prepare(self, rp: RunningPod, pod: dict[str, Any]) -> list[podspec.ContainerPlan]:
        ns = rp.namespace
        volumes = podspec.volume_plans(pod)
        dirs: dict[str, str] = {}
        config_maps: dict[str, dict[str, str]] = {}
        for vol in volumes.values():
            vdir = rp.dir / "volumes" / vol.name
            if vol.kind == "configMap":
                data = self._config_map(ns, vol.ref or "", config_maps)
                files = {path: data[key] for key, path in vol.items} if vol.items else data
                sandbox.write_files(vdir, files)
            elif vol.kind == "claim":
                vdir = self.claim_dir(ns, vol.ref or "")
                vdir.mkdir(parents=True, exist_ok=True)
            elif vol.kind == "projected":
                sandbox.write_files(vdir, self._projected(pod, vol.name, config_maps))
            else:
                vdir.mkdir(parents=True, exist_ok=True)
            dirs[vol.name] = str(vdir)
        base = sandbox.base_env(rp.name, "127.0.0.1", self.api_port)
        plans = []
        for c in pod["spec"]["containers"]:
            env = podspec.resolve_env(pod, c, POD_IP, config_maps, base)
            env |= injected_env(pod["metadata"].get("labels") or {}, self.injections)
            plans.append(podspec.container_plan(pod, c, dirs, volumes, env))
        return plans

    def claim_dir(self, namespace: str, claim: str) -> Path:
        """Where a PersistentVolumeClaim's data lives on this node (shared by its pods)."""
        return self.workdir / "claims" / namespace / claim

    def _config_map(self, ns: str, name: str, cache: dict[str, dict[str, str]]
                    ) -> dict[str, str]:
        if name not in cache:
            try:
                cache[name] = dict(self.api.read_namespaced_config_map(name, ns).data or {})
            except ApiException as err:
                raise podspec.PodSpecError("CreateContainerConfigError",
                                           f"configmap {name!r}: {err.reason}") from err
        return cache[name]

    def _projected(self, pod: dict[str, Any], volume: str,
                   config_maps: dict[str, dict[str, str]]) -> dict[str, str]:
        """The service-account volume the API server injects: token, CA and namespace."""
        spec = next(v for v in pod["spec"]["volumes"] if v["name"] == volume)["projected"]
        meta = pod["metadata"]
        files: dict[str, str] = {}
        for src in spec.get("sources") or []:
            if "serviceAccountToken" in src:
                sat = src["serviceAccountToken"]
                req: Any = {"spec": {"audiences": [sat.get("audience") or SA_AUDIENCE],
                                "expirationSeconds": sat.get("expirationSeconds") or 3600,
                                "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                                                   "name": meta["name"], "uid": meta["uid"]}}}
                tok = self.api.create_namespaced_service_account_token(
                    pod["spec"].get("serviceAccountName", "default"), meta["namespace"], req)
                files[sat["path"]] = str(tok.status.token if tok.status else "")
            elif "configMap" in src:
                cm = src["configMap"]
                if cm["name"] == "kube-root-ca.crt":  # no root-CA publisher runs here
                    data = {"ca.crt": self.ca_cert.read_text()}
                else:
                    data = self._config_map(meta["namespace"], cm["name"], config_maps)
                for item in cm.get("items") or [{"key": k, "path": k} for k in data]:
                    files[item["path"]] = data[item["key"]]
            elif "downwardAPI" in src:
                for item in src["downwardAPI"].get("items") or []:
                    files[item["path"]] = podspec.field_ref(
                        pod, item["fieldRef"]["fieldPath"], POD_IP)
        return files

