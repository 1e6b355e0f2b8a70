"""What a remediation rung must achieve: no pod limit lower, more headroom where it failed.

A restart after an OOM must never make things worse. The ladder therefore keeps a rung
only when, against the plan it replaces,
- every pod limit (memory, CPUs, GPUs, /dev/shm, head and workers) is the same or higher;
- the modelled headroom for the failure class is strictly higher: none of its parts is
  lower and at least one is higher. The parts are what could have run out:
  CudaOOM: per GPU, capacity minus the peak of each stage (load, training, rollout);
  HostOOM: per pod, the memory limit minus the modelled need (the kernel kills at it);
  RayOOM: per pod, Ray's kill threshold (95% of the limit) minus the modelled need.
A rung that changes none of these changes nothing a restart could benefit from.
"""

from __future__ import annotations

from grpo_api.contract import FailureReason, RankStage

from .budget import RAY_MEMORY_USAGE_THRESHOLD
from .resources import pod_need_gib
from .types import GPU_STAGES, Plan, PodResources

EPSILON_GIB = 1e-6  # float noise in sums of terms is not a change


def pod_limits(plan: Plan) -> dict[str, float]:
    """Every limit the plan puts on a pod, by "role.field"."""
    out: dict[str, float] = {}
    for pod in (plan.head, plan.rank0_pod, plan.worker):
        if pod is not None:
            out |= {
                f"{pod.role}.memoryGiB": pod.memory_gib,
                f"{pod.role}.shmGiB": pod.shm_gib,
                f"{pod.role}.cpus": pod.cpus,
                f"{pod.role}.gpus": pod.gpus,
            }
    return out


def headroom(plan: Plan, failure: FailureReason,
             stage: RankStage | None = None) -> dict[str, float]:
    """The modelled headroom (GiB) for `failure`, by part; empty when no memory model
    covers the class (a ladder cannot help it). A CudaOOM whose rank stage is known
    counts only that stage's GPU stages (all of them if the plan has none of those)."""
    b = plan.budget
    if failure is FailureReason.CUDA_OOM:
        parts = {
            f"gpu.{name}": b.gpu_capacity_gib - sum(terms.values())
            for name, terms in b.gpu_stages.items()
        }
        wanted = {f"gpu.{name}" for name in GPU_STAGES.get(stage, ())} if stage else set()
        return {k: v for k, v in parts.items() if k in wanted} or parts
    if failure in (FailureReason.HOST_OOM, FailureReason.RAY_OOM):
        kill_at = 1.0 if failure is FailureReason.HOST_OOM else RAY_MEMORY_USAGE_THRESHOLD
        pods: tuple[PodResources | None, ...] = (plan.head, plan.rank0_pod, plan.worker)
        return {
            f"{p.role}.memory": p.memory_gib * kill_at
            - pod_need_gib(plan.geometry, plan.settings, b, p.role)
            for p in pods
            if p is not None
        }
    return {}


def changed_limits(old: Plan, new: Plan) -> dict[str, tuple[float, float]]:
    """The pod limits that differ, by "role.field": (old, new)."""
    before, after = pod_limits(old), pod_limits(new)
    keys = before.keys() | after.keys()
    return {
        k: (before.get(k, 0.0), after.get(k, 0.0))
        for k in sorted(keys)
        if before.get(k, 0.0) != after.get(k, 0.0)
    }


def improves(old: Plan, new: Plan, failure: FailureReason,
             stage: RankStage | None = None) -> bool:
    """True when `new` lowers no pod limit and no part of the headroom for `failure`, and
    raises at least one part of it: of the GPU stages of the rank `stage` the failure
    happened in, when known. vLLM's KV cache (RankStage.KV_CACHE) ran short because vLLM
    had too little of the GPU: there `new` must give it more KV cache per GPU and still
    fit with the margin, though the rollout stage's headroom shrinks by design."""
    if any(b < a for a, b in changed_limits(old, new).values()):
        return False
    if failure is FailureReason.CUDA_OOM and stage is RankStage.KV_CACHE:
        return (new.budget.fits and new.budget.rollout_kv_cache_gib
                > old.budget.rollout_kv_cache_gib + EPSILON_GIB)
    before, after = headroom(old, failure), headroom(new, failure)
    if not before or before.keys() != after.keys():
        return False
    if any(after[k] < before[k] - EPSILON_GIB for k in before):
        return False
    return any(after[k] > before[k] + EPSILON_GIB for k in headroom(old, failure, stage))
