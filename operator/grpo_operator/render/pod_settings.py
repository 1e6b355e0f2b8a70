"""spec.pods on the Ray pods (pure): merge `common` with a role, and refuse what would
override the operator's own settings, naming the field.

What the operator owns on a Ray pod: its env (every GRPO_* name and whatever the plan
sets; Ray's RAY_EXPERIMENTAL_NOSET_* device-masking switches are refused too), its
volumes and mount paths, the GPU node selector, and the reserved label and annotation
prefixes. Resources, image and command are not settable at all (api/pods.py).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from pathlib import PurePosixPath
from typing import Any

from grpo_api.catalog import GPU_PRODUCT_LABEL
from grpo_api.contract import API_GROUP, CHECKPOINT_MOUNT, CONFIG_PATH, MODEL_MOUNT
from grpo_api.job.pods import PodSettings, PodsSpec

ROLES = ("head", "workers")
OPERATOR_VOLUMES = {"checkpoints", "config", "dshm", "models"}
OPERATOR_MOUNTS = (CHECKPOINT_MOUNT, str(PurePosixPath(CONFIG_PATH).parent), "/dev/shm",
                   MODEL_MOUNT)
RESERVED_PREFIXES = (f"{API_GROUP}/", "ray.io/")
OPERATOR_ENV_PREFIX = "GRPO_"
# Ray's switches that stop it setting CUDA_VISIBLE_DEVICES (and the ROCm, Ascend, ...
# equivalents) per actor: RAY_EXPERIMENTAL_NOSET_<X>_VISIBLE_DEVICES and kin.
RAY_NOSET_PREFIX = "RAY_EXPERIMENTAL_NOSET_"
# The containers the operator names: spec.pods.*.initContainers take other names.
OPERATOR_CONTAINERS = ("hub-fetch", "ray-head", "ray-worker")


def merged(pods: PodsSpec, role: str) -> dict[str, Any]:
    """The settings of `role` (head or workers) on top of `common`, in Pod wire form:
    lists appended, maps merged, the role's scalars winning."""
    base, own = (_wire(pods.common), _wire(getattr(pods, role)))
    out = dict(base)
    for key, value in own.items():
        if isinstance(value, list):
            out[key] = [*base[key], *value]
        elif isinstance(value, dict) and key in ("labels", "annotations", "nodeSelector"):
            out[key] = {**base[key], **value}
        elif value not in (None, {}):  # the API server defaults unset sections to {}
            out[key] = value
    return out


LISTS = ("env", "envFrom", "volumes", "volumeMounts", "tolerations", "imagePullSecrets",
         "initContainers", "topologySpreadConstraints")
MAPS = ("labels", "annotations", "nodeSelector")


def _wire(s: PodSettings) -> dict[str, Any]:
    """Every field: unset lists as [], maps as {}, other unset ones as None; nested
    objects without their unset fields."""
    out = {k: _no_none(v) for k, v in s.model_dump(by_alias=True, mode="json").items()}
    return out | {k: out[k] or [] for k in LISTS} | {k: out[k] or {} for k in MAPS}


def _no_none(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _no_none(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_no_none(x) for x in v]
    return v


def _under(a: str, b: str) -> bool:
    """Whether one path is `b` or inside it, either way round (one would hide the other)."""
    pa, pb = PurePosixPath(a), PurePosixPath(b)
    return pa == pb or pb in pa.parents or pa in pb.parents


def _env_problem(at: str, name: str, env: set[str]) -> str | None:
    """Why an env var of spec.pods (at `at`) would override the operator's, or None."""
    if name in env or name.startswith(OPERATOR_ENV_PREFIX):
        return (f"{at}.name: {name} is set by the operator (the planner's settings, the "
                "job's identity, spec.logging's secret); set spec.memory.* or "
                "spec.logging.*, or leave it out")
    if name.startswith(RAY_NOSET_PREFIX):
        return (f"{at}.name: {name} would stop Ray masking every actor's devices, the "
                "trainer's probes and helpers too; the trainer relies on that and unmasks "
                "only its rank actors, binding each to its GPU itself; leave it out")
    return None


def conflicts(pods: PodsSpec, operator_env: Iterable[str]) -> list[str]:
    """Every setting that would override the operator's, as "spec.pods.<path>: why"."""
    env = set(operator_env)
    out: list[str] = []
    for section in ("common", *ROLES):
        s: PodSettings = getattr(pods, section)
        at = f"spec.pods.{section}"
        named = [(f"{at}.env[{i}]", e.name) for i, e in enumerate(s.env or [])]
        for i, c in enumerate(s.init_containers or []):
            if c.name in OPERATOR_CONTAINERS:
                out.append(f"{at}.initContainers[{i}].name: {c.name!r} is the operator's "
                           "container; choose another name")
            named += [(f"{at}.initContainers[{i}].env[{j}]", e.name)
                      for j, e in enumerate(c.env or [])]
        out += [p for where, name in named if (p := _env_problem(where, name, env))]
        for i, v in enumerate(s.volumes or []):
            if v.name in OPERATOR_VOLUMES:
                out.append(f"{at}.volumes[{i}].name: {v.name!r} is the operator's volume; "
                           "choose another name")
        for i, m in enumerate(s.volume_mounts or []):
            hit = next((p for p in OPERATOR_MOUNTS if _under(m.mount_path, p)), None)
            if hit:
                out.append(f"{at}.volumeMounts[{i}].mountPath: {m.mount_path} would hide or "
                           f"shadow the operator's mount at {hit}; choose another path")
        if GPU_PRODUCT_LABEL in (s.node_selector or {}):
            out.append(f"{at}.nodeSelector.{GPU_PRODUCT_LABEL}: the GPU type is "
                       "spec.resources.gpuType; set that instead")
        for field, values in (("labels", s.labels or {}), ("annotations", s.annotations or {})):
            for key in values:
                if key.startswith(RESERVED_PREFIXES):
                    out.append(f"{at}.{field}.{key}: the {key.split('/')[0]}/ prefix is the "
                               "operator's and KubeRay's")
    for role in ROLES:
        out += _role_conflicts(pods, role)
    return out


def _role_conflicts(pods: PodsSpec, role: str) -> list[str]:
    """Within one pod (common + role): duplicate names, mounts of unknown volumes."""
    m = merged(pods, role)
    out = []
    for field in ("env", "volumes", "initContainers"):
        names = [x["name"] for x in m.get(field, [])]
        for dup in sorted({n for n in names if names.count(n) > 1}):
            out.append(f"spec.pods.{role}.{field}: {dup!r} is set twice (in common and "
                       f"{role}, or twice in one); keep one")
    volumes = {v["name"] for v in m.get("volumes", [])}
    for mount in m.get("volumeMounts", []):
        if mount["name"] not in volumes:
            out.append(f"spec.pods.{role}: volumeMount {mount['name']!r} at "
                       f"{mount['mountPath']} names no volume in spec.pods.common.volumes "
                       f"or spec.pods.{role}.volumes")
    return out


# The most a preferred term weighs (Kubernetes allows 1-100): it outweighs the scheduler's
# other scores between otherwise equal nodes.
AVOID_WEIGHT = 100


def avoiding(affinity: dict[str, Any] | None, nodes: tuple[str, ...]) -> dict[str, Any] | None:
    """`affinity` (a pod's, as spec.pods sets it) that prefers nodes other than `nodes`:
    a preferred node-affinity term on the node's name, beside the pod's own terms. Not a
    required one: where no other node fits (a one-node pool, a drained node that comes
    back) the pod still runs there instead of waiting for good."""
    if not nodes:
        return affinity
    out = copy.deepcopy(affinity or {})
    preferred = out.setdefault("nodeAffinity", {}).setdefault(
        "preferredDuringSchedulingIgnoredDuringExecution", [])
    preferred.append({"weight": AVOID_WEIGHT, "preference": {"matchFields": [
        {"key": "metadata.name", "operator": "NotIn", "values": list(nodes)}]}})
    return out
