"""What the local node agent does with a pod, as pure functions of the pod object.

The agent plays the kubelet for one node: these functions turn a pod (the dict the
API server returns) into the environment, mounts and limits of a local process, and
a process outcome back into the pod status a kubelet would write. No I/O here, so
every rule is unit-tested on real pod shapes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kubernetes.utils import parse_quantity

SA_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
TERMINATION_MESSAGE_LIMIT = 4096  # bytes, as the kubelet caps it
LOG_FALLBACK_LINES = 80
SIGKILL_EXIT = 128 + 9


class PodSpecError(ValueError):
    """The pod asks for something this node cannot do; the reason goes in its status."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Mount:
    """A bind mount (or tmpfs when ``source`` is None) inside the container's namespace."""

    target: str
    source: str | None
    read_only: bool = False
    tmpfs_bytes: int | None = None


@dataclass(frozen=True)
class VolumePlan:
    """How one pod volume is materialised on this node."""

    name: str
    kind: str  # "configMap" | "claim" | "emptyDir" | "tmpfs" | "projected"
    ref: str | None = None  # ConfigMap or claim name
    items: tuple[tuple[str, str], ...] = ()  # (key, path) for configMap items
    size_bytes: int | None = None


@dataclass
class ContainerPlan:
    name: str
    argv: list[str]
    env: dict[str, str]
    mounts: list[Mount]
    memory_limit: int | None
    termination_path: str
    fallback_to_logs: bool
    image: str
    notes: list[str] = field(default_factory=list)


def _by_label(expr: str, mapping: Mapping[str, str]) -> str:
    m = re.fullmatch(r"\['(.+)'\]", expr)
    return mapping.get(m.group(1), "") if m else ""


def field_ref(pod: Mapping[str, Any], path: str, pod_ip: str) -> str:
    """The Downward API fields KubeRay and our templates use."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", "default"),
        "status.podIP": pod_ip,
        "status.hostIP": pod_ip,
        "status.podIPs": pod_ip,
    }
    if path in simple:
        return str(simple[path])
    for prefix, key in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path.startswith(prefix):
            return _by_label(path[len(prefix):], meta.get(key) or {})
    raise PodSpecError("CreateContainerConfigError", f"unsupported fieldRef {path!r}")


def resource_ref(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """resourceFieldRef as the kubelet renders it: CPUs rounded up, bytes as integers."""
    kind, _, res = str(ref["resource"]).partition(".")
    value = (container.get("resources", {}).get(kind) or {}).get(res)
    if value is None:
        return "0"
    divisor = parse_quantity(ref.get("divisor") or "1") or 1  # the API defaults it to 0
    q = parse_quantity(value) / divisor
    return str(math.ceil(q))


def resolve_env(pod: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str,
                config_maps: Mapping[str, Mapping[str, str]],
                base: Mapping[str, str]) -> dict[str, str]:
    """``base`` (the node's own variables) overlaid with the container's env, in order.

    ``$(VAR)`` references to earlier variables are expanded, as the kubelet does.
    """
    env = dict(base)
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                               lambda m: env.get(m.group(1), m.group(0)), str(item["value"]))
            continue
        src = item.get("valueFrom") or {}
        if "fieldRef" in src:
            env[name] = field_ref(pod, src["fieldRef"]["fieldPath"], pod_ip)
        elif "resourceFieldRef" in src:
            env[name] = resource_ref(container, src["resourceFieldRef"])
        elif "configMapKeyRef" in src:
            ref = src["configMapKeyRef"]
            data = config_maps.get(ref["name"])
            if data is None or ref["key"] not in data:
                if ref.get("optional"):
                    continue
                raise PodSpecError("CreateContainerConfigError",
                                   f"configmap {ref['name']!r} key {ref['key']!r} not found")
            env[name] = data[ref["key"]]
        else:
            raise PodSpecError("CreateContainerConfigError",
                               f"env {name}: unsupported valueFrom {sorted(src)}")
    return env


def volume_plans(pod: Mapping[str, Any]) -> dict[str, VolumePlan]:
    out: dict[str, VolumePlan] = {}
    for v in pod.get("spec", {}).get("volumes") or []:
        name = v["name"]
        if "configMap" in v:
            cm = v["configMap"]
            items = tuple((i["key"], i["path"]) for i in cm.get("items") or [])
            out[name] = VolumePlan(name, "configMap", cm["name"], items)
        elif "persistentVolumeClaim" in v:
            out[name] = VolumePlan(name, "claim", v["persistentVolumeClaim"]["claimName"])
        elif "emptyDir" in v:
            ed = v["emptyDir"] or {}
            size = ed.get("sizeLimit")
            kind = "tmpfs" if ed.get("medium") == "Memory" else "emptyDir"
            out[name] = VolumePlan(name, kind,
                                   size_bytes=int(parse_quantity(size)) if size else None)
        elif "projected" in v:
            out[name] = VolumePlan(name, "projected")
        else:
            kinds = sorted(k for k in v if k != "name")
            raise PodSpecError("CreateContainerConfigError",
                               f"volume {name}: {kinds} is not supported by the local node")
    return out


def container_plan(pod: Mapping[str, Any], container: Mapping[str, Any],
                   volume_dirs: Mapping[str, str], volumes: Mapping[str, VolumePlan],
                   env: dict[str, str]) -> ContainerPlan:
    """The process to run for one container; ``volume_dirs`` are the host directories."""
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if not container.get("command"):
        raise PodSpecError(
            "CreateContainerError",
            f"container {container['name']}: the local node runs commands, not images; "
            "set spec.containers[].command")
    mounts: list[Mount] = []
    for vm in container.get("volumeMounts") or []:
        vol = volumes.get(vm["name"])
        if vol is None:
            raise PodSpecError("CreateContainerConfigError",
                               f"volumeMount {vm['name']!r} names no volume of the pod")
        ro = bool(vm.get("readOnly")) or vol.kind in ("configMap", "projected")
        if vol.kind == "tmpfs":
            mounts.append(Mount(vm["mountPath"], None, ro, vol.size_bytes))
        else:
            src = volume_dirs[vol.name]
            if vm.get("subPath"):
                src = f"{src}/{vm['subPath']}"
            mounts.append(Mount(vm["mountPath"], src, ro))
    limits = (container.get("resources") or {}).get("limits") or {}
    mem = limits.get("memory")
    return ContainerPlan(
        name=container["name"],
        argv=[str(a) for a in argv],
        env=env,
        mounts=mounts,
        memory_limit=int(parse_quantity(mem)) if mem else None,
        termination_path=container.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH,
        fallback_to_logs=container.get("terminationMessagePolicy") == "FallbackToLogsOnError",
        image=container.get("image", ""),
    )


def exit_code_of(returncode: int) -> int:
    """Popen's negative signal numbers as a container runtime reports them (128 + n)."""
    return 128 - returncode if returncode < 0 else returncode


def terminated_state(returncode: int, oom_killed: bool, message: str, log_tail: str,
                     fallback_to_logs: bool, started_at: str, finished_at: str,
                     container_id: str) -> dict[str, Any]:
    code = exit_code_of(returncode)
    reason = "OOMKilled" if oom_killed else ("Completed" if code == 0 else "Error")
    msg = message
    if not msg.strip() and fallback_to_logs and code != 0:
        msg = "\n".join(log_tail.splitlines()[-LOG_FALLBACK_LINES:])
    raw = msg.encode()[-TERMINATION_MESSAGE_LIMIT:]
    state: dict[str, Any] = {"exitCode": code, "reason": reason, "startedAt": started_at,
                             "finishedAt": finished_at, "containerID": container_id}
    if raw:
        state["message"] = raw.decode(errors="replace")
    return state


def _condition(kind: str, status: bool, now: str) -> dict[str, str]:
    return {"type": kind, "status": "True" if status else "False", "lastTransitionTime": now}


def pod_status(pod: Mapping[str, Any], pod_ip: str, containers: Mapping[str, dict[str, Any]],
               now: str, start_time: str,
               container_ids: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A whole pod status from each container's state (``{"running": ...}`` etc.).

    restartPolicy Never or OnFailure-with-exhausted-restarts is all this node does:
    a pod whose containers all ended is Succeeded when every exit was 0, else Failed.
    """
    statuses = []
    for c in pod["spec"]["containers"]:
        state = containers.get(c["name"], {"waiting": {"reason": "ContainerCreating"}})
        statuses.append({
            "name": c["name"], "image": c.get("image", ""), "imageID": "",
            "ready": "running" in state, "restartCount": 0, "started": "running" in state,
            "state": state,
            **({"containerID": (container_ids or {})[c["name"]]}
               if c["name"] in (container_ids or {}) else {}),
        })
    ended = [s["state"]["terminated"] for s in statuses if "terminated" in s["state"]]
    running = any("running" in s["state"] for s in statuses)
    if len(ended) == len(statuses):
        phase = "Succeeded" if all(t["exitCode"] == 0 for t in ended) else "Failed"
    else:
        phase = "Running" if running or ended else "Pending"
    ready = phase == "Running" and all(s["ready"] for s in statuses)
    return {
        "phase": phase,
        "hostIP": pod_ip,
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": start_time,
        "qosClass": "Guaranteed",
        "conditions": [
            _condition("PodScheduled", True, start_time),
            _condition("Initialized", True, start_time),
            _condition("ContainersReady", ready, now),
            _condition("Ready", ready, now),
        ],
        "containerStatuses": statuses,
    }


def failed_to_start(pod: Mapping[str, Any], pod_ip: str, err: PodSpecError,
                    now: str) -> dict[str, Any]:
    """Status for a pod this node cannot run: the reason a user would see from kubectl."""
    states = {c["name"]: {"waiting": {"reason": err.reason, "message": str(err)}}
              for c in pod["spec"]["containers"]}
    status = pod_status(pod, pod_ip, states, now, now)
    status["phase"] = "Pending"
    return status


def local_node_manifest(name: str, cpus: int, memory_bytes: int,
                        kubelet_version: str) -> dict[str, Any]:
    """A Node that kwok leaves alone (no kwok annotation): this agent keeps it Ready."""
    capacity = {"cpu": str(cpus), "memory": str(memory_bytes), "pods": "16",
                "ephemeral-storage": "100Gi"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "local",
                "type": "local",
            },
        },
        "spec": {},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                          {"type": "Hostname", "address": name}],
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                         "kubeletVersion": kubelet_version,
                         "kubeProxyVersion": kubelet_version, "bootID": "",
                         "containerRuntimeVersion": "grpo-local://1", "kernelVersion": "",
                         "machineID": "", "osImage": "local processes", "systemUUID": ""},
        },
    }


def node_ready_status(now: str) -> dict[str, Any]:
    ok = {"status": "False", "lastHeartbeatTime": now, "lastTransitionTime": now}
    return {"conditions": [
        {"type": "Ready", "status": "True", "reason": "LocalAgentReady",
         "message": "grpo-testbed local node agent is running", "lastHeartbeatTime": now,
         "lastTransitionTime": now},
        {"type": "MemoryPressure", "reason": "Fine", "message": "", **ok},
        {"type": "DiskPressure", "reason": "Fine", "message": "", **ok},
        {"type": "PIDPressure", "reason": "Fine", "message": "", **ok},
    ]}
