"""What a job's namespace will refuse, known before any pod exists (pure).

The webhook gathers the namespace's facts (its Pod Security enforce level, its GPU
ResourceQuotas) and refuses at `kubectl apply` what the namespace would refuse later,
when KubeRay creates the pods and only KubeRay would see why. The rules are Kubernetes'
Pod Security Standards (https://kubernetes.io/docs/concepts/security/pod-security-standards/)
for the fields the operator's pods can carry, checked on the rendered pod templates, so
what the operator sets itself (render/security.py) is checked with what users add.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_api.catalog import GPU_RESOURCE
from grpo_api.contract import ROLE_LABEL

from .render.security import BASELINE_CAPABILITIES, RESTRICTED_CAPABILITIES

ENFORCE_LABEL = "pod-security.kubernetes.io/enforce"
LEVELS = ("privileged", "baseline", "restricted")
GPU_QUOTA = f"requests.{GPU_RESOURCE}"  # extended resources are quota'd on requests only
# Volume types `restricted` allows; `baseline` forbids only hostPath.
RESTRICTED_VOLUMES = frozenset({"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                                "persistentVolumeClaim", "projected", "secret"})
_SECURE_SECCOMP = ("RuntimeDefault", "Localhost")


@dataclass(frozen=True)
class GpuQuota:
    """One ResourceQuota's GPU limit in the namespace, and what is in use."""

    name: str
    hard: str
    used: str = "0"


@dataclass(frozen=True)
class NamespaceFacts:
    """What the webhook read about the job's namespace."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    gpu_quotas: tuple[GpuQuota, ...] = ()

    @property
    def level(self) -> str:
        """The Pod Security level enforced (unlabelled: privileged, Kubernetes' default
        unless the API server's admission configuration sets another)."""
        value = self.labels.get(ENFORCE_LABEL, "privileged")
        return value if value in LEVELS else "restricted"  # unknown: the API server's


@dataclass(frozen=True)
class Violation:
    """One Pod Security rule a rendered pod breaks: where in the pod, and why."""

    path: str  # e.g. volumes[host].hostPath, securityContext.runAsUser, containers[x]...
    why: str
    level: str  # the lowest level that forbids it


def pod_violations(pod: Mapping[str, Any], level: str) -> list[Violation]:
    """The Pod Security rules of `level` that the pod spec `pod` breaks."""
    if level not in LEVELS or level == "privileged":
        return []
    found = _baseline(pod)
    if level == "restricted":
        found += _restricted(pod)
    return found


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [*(pod.get("initContainers") or []), *(pod.get("containers") or [])]


def _baseline(pod: Mapping[str, Any]) -> list[Violation]:
    out = [Violation(f"{key}", f"{key} is forbidden", "baseline")
           for key in ("hostNetwork", "hostPID", "hostIPC") if pod.get(key)]
    for v in pod.get("volumes") or []:
        if "hostPath" in v:
            out.append(Violation(f"volumes[{v['name']}].hostPath", "hostPath volumes are "
                                 "forbidden", "baseline"))
    if ((pod.get("securityContext") or {}).get("seccompProfile") or {}).get(
            "type") == "Unconfined":
        out.append(Violation("securityContext.seccompProfile.type",
                             "seccomp profile Unconfined is forbidden", "baseline"))
    for c in _containers(pod):
        sc = c.get("securityContext") or {}
        at = f"containers[{c['name']}].securityContext"
        if sc.get("privileged"):
            out.append(Violation(f"{at}.privileged", "privileged containers are forbidden",
                                 "baseline"))
        extra = sorted(set((sc.get("capabilities") or {}).get("add") or [])
                       - BASELINE_CAPABILITIES)
        if extra:
            out.append(Violation(f"{at}.capabilities.add", f"adding {', '.join(extra)} is "
                                 "forbidden", "baseline"))
    return out


def _restricted(pod: Mapping[str, Any]) -> list[Violation]:
    out = []
    for v in pod.get("volumes") or []:
        kind = next((k for k in v if k != "name"), "")
        if kind not in RESTRICTED_VOLUMES and kind != "hostPath":  # hostPath: baseline's
            out.append(Violation(f"volumes[{v['name']}].{kind}", f"{kind} volumes are "
                                 "forbidden",
                                 "restricted"))
    psc = pod.get("securityContext") or {}
    if psc.get("runAsUser") == 0:
        out.append(Violation("securityContext.runAsUser", "running as root (0) is "
                             "forbidden", "restricted"))
    containers = _containers(pod)
    if psc.get("runAsUser") != 0 and psc.get("runAsNonRoot") is not True and not all(
            (c.get("securityContext") or {}).get("runAsNonRoot") for c in containers):
        out.append(Violation("securityContext.runAsNonRoot", "runAsNonRoot must be true",
                             "restricted"))
    pod_seccomp = (psc.get("seccompProfile") or {}).get("type")
    for c in containers:
        sc = c.get("securityContext") or {}
        at = f"containers[{c['name']}].securityContext"
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(Violation(f"{at}.allowPrivilegeEscalation", "allowPrivilegeEscalation "
                                 "must be false", "restricted"))
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(Violation(f"{at}.capabilities.drop", "capabilities must drop ALL",
                                 "restricted"))
        extra = sorted(set(caps.get("add") or []) - RESTRICTED_CAPABILITIES
                       & BASELINE_CAPABILITIES)  # beyond baseline: reported as baseline's
        if extra:
            out.append(Violation(f"{at}.capabilities.add", f"adding {', '.join(extra)} is "
                                 "forbidden (only NET_BIND_SERVICE)", "restricted"))
        seccomp = (sc.get("seccompProfile") or {}).get("type") or pod_seccomp
        if seccomp not in _SECURE_SECCOMP:
            out.append(Violation(f"{at}.seccompProfile", "a seccomp profile of RuntimeDefault "
                                 "or Localhost is required", "restricted"))
    return out


def _fix(v: Violation) -> str:
    if v.path.startswith("volumes["):
        return ("use a persistentVolumeClaim or csi volume instead (a claim can bind a "
                "PersistentVolume an administrator made for that storage)")
    if v.path.startswith("securityContext."):
        return "leave it unset: the pods run as the images' non-root user"
    return ""


def locate(pods: Mapping[str, Any], sections: Iterable[str], v: Violation) -> str:
    """The spec field behind a violation on a rendered pod: the spec.pods entry that set
    it, or (capabilities, the operator's own settings) what the operator rendered."""
    for section in sections:
        s = pods.get(section) or {}
        if v.path.startswith("volumes["):
            name, _, rest = v.path.removeprefix("volumes[").partition("]")
            for i, vol in enumerate(s.get("volumes") or []):
                if vol.get("name") == name:
                    return f"spec.pods.{section}.volumes[{i}]{rest}"
        elif v.path.startswith("securityContext."):
            key = v.path.split(".")[1]
            if key in (s.get("securityContext") or {}):
                return f"spec.pods.{section}.{v.path}"
    if v.path.endswith("capabilities.add"):
        return f"the Ray pods' {v.path} (capabilities the job's network needs)"
    return f"the Ray pods' {v.path}"


def pod_security_problem(pods_spec: Mapping[str, Any], templates: Mapping[str, Any],
                         ns: NamespaceFacts) -> str | None:
    """What the namespace's Pod Security level refuses in the rendered pod templates
    (`templates`: role -> pod spec), as one message naming each spec field, the
    namespace's level and the fix; None when it allows them."""
    level = ns.level
    found: list[str] = []
    # The least restrictive level any violation needs: the one below the lowest level
    # that forbids it (a capability baseline forbids needs privileged).
    needed = level
    for role, pod in templates.items():
        sections = ("common", "head" if role == "head" else "workers")
        for v in pod_violations(pod, level):
            needed = min(needed, LEVELS[LEVELS.index(v.level) - 1], key=LEVELS.index)
            fix = _fix(v)
            line = f"{locate(pods_spec, sections, v)}: {v.why}{f'; {fix}' if fix else ''}"
            if line not in found:
                found.append(line)
    if not found:
        return None
    return (f"namespace {ns.name} enforces Pod Security {level!r} (label "
            f"{ENFORCE_LABEL}={level}), whose admission would refuse the job's Ray pods: "
            f"{'. '.join(found)}. Change these settings, or run the job in a namespace "
            f"whose level allows them ({needed!r}: kubectl label namespace {ns.name} "
            f"{ENFORCE_LABEL}={needed} --overwrite, where the platform allows it)")


def count(quantity: str) -> int | None:
    """A whole-number quantity (GPU counts), None if it is not one."""
    try:
        value = float(quantity)
    except ValueError:
        return None
    return int(value) if value == int(value) else None


def gpu_quota_problem(gpus: int, ns: NamespaceFacts) -> str | None:
    """The first GPU ResourceQuota with less room than the job's `gpus`, as a message."""
    for q in ns.gpu_quotas:
        hard, used = count(q.hard), count(q.used)
        if hard is None or used is None or gpus <= hard - used:
            continue
        return (f"the job needs {gpus} GPU(s) ({GPU_QUOTA}), but ResourceQuota {q.name} in "
                f"namespace {ns.name} leaves {max(hard - used, 0)} (hard {hard}, used "
                f"{used}); KubeRay could not create its pods. Use fewer spec.resources.nodes "
                "or a smaller GPU count, wait for other jobs to end, or raise the quota")
    return None


def template_gpus(ray_cluster: Mapping[str, Any]) -> int:
    """GPUs every pod of a rendered RayCluster requests together."""
    spec = ray_cluster.get("spec") or {}
    groups = [(spec.get("headGroupSpec") or {}, 1)] + [
        (g, int(g.get("replicas") or 0)) for g in spec.get("workerGroupSpecs") or []]
    total = 0
    for group, replicas in groups:
        for c in ((group.get("template") or {}).get("spec") or {}).get("containers") or []:
            want = ((c.get("resources") or {}).get("requests") or {}).get(GPU_RESOURCE, 0)
            total += replicas * (count(str(want)) or 0)
    return total


def templates(ray_cluster: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """role (head / worker / rollout) -> pod spec of a rendered RayCluster: each worker
    group's by its own role (a disaggregated job's rollout group is not the training
    workers', whose devices may need capabilities)."""
    spec = ray_cluster.get("spec") or {}
    out = {"head": spec["headGroupSpec"]["template"]["spec"]}
    for g in spec.get("workerGroupSpecs") or []:
        labels = (g["template"].get("metadata") or {}).get("labels") or {}
        out[str(labels.get(ROLE_LABEL) or "worker")] = g["template"]["spec"]
    return out
