"""Remediation after an OOM: the next safer plan, one rung per restart (docs/memory-model.md).

CudaOOM:        gradient checkpointing on -> halve micro-batch (its token budget, when
                micro-batches go by tokens) -> lower rollout GPU memory
                utilisation -> bf16 training (only with spec.recovery.
                allowPrecisionChange) -> offload optimizer -> offload params
CudaOOM of vLLM's KV cache (rank stage kv_cache: too little left for it at engine start):
                raise rollout GPU memory utilisation (to what the update's residency leaves)
                -> offload optimizer, then raise it -> offload params, then raise it
HostOOM/RayOOM: params offload off -> optimizer offload off -> smaller Ray object store ->
                pod memory up to node allocatable
Each rung applies at most once, leaves alone what the spec pinned, does not push the other
resource over its budget (never offload into host RAM that is not there; never pull back
onto a GPU that cannot hold it), and is kept only if it lowers no pod limit and raises the
modelled headroom for the failure (headroom.improves); otherwise the next rung is tried.
Fewer generations per prompt is not a rung: it changes the algorithm, and the memory it
would free the micro-batch's rung frees without changing it (vLLM's KV cache is sized by
its utilisation; the update's micro-batch is bounded by its budget, whatever the group).
Other failures (NodeLost, Error, ...) have no memory ladder: restart with the same plan.
A disaggregated job's rollout-side failures (a rollout pod's, or an OOM while generating)
walk planner/rollout_ladder.py's rungs instead, and the rungs here never touch vLLM's
share there (it is the rollout GPUs', not the training GPUs').
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from grpo_api.catalog import GPU_CATALOG, GpuType
from grpo_api.contract import FailureReason, RankStage
from grpo_api.job.spec import GRPOJobSpec

from .core import _micro_batches, plan_memory, replan
from .headroom import improves
from .layout import least_budget
from .modes import BF16, MIXED
from .report import plan_changes
from .resources import STORE_MIN_GIB
from .rollout_ladder import changes_rollout_side, on_rollout_side, rollout_ladder
from .stage_terms import compute_budget, max_rollout_utilization
from .types import Budget, Plan, Settings

Rung = Callable[[Plan], Settings | None]


def _gc_on(p: Plan) -> Settings | None:
    if p.settings.gradient_checkpointing or "gradient_checkpointing" in p.pinned:
        return None
    return replace(p.settings, gradient_checkpointing=True)


def _halve_micro_batch(p: Plan) -> Settings | None:
    """Half the token budget when micro-batches go by tokens (not below one whole
    sample), else the next divisor of the rank's batch at most half the micro-batch."""
    if p.settings.micro_batch_tokens:
        if "micro_batch_tokens" in p.pinned:
            return None
        least = least_budget(p.geometry)
        half = max(least, p.settings.micro_batch_tokens // 2)
        if half >= p.settings.micro_batch_tokens:
            return None
        return replace(p.settings, micro_batch_tokens=half)
    if "micro_batch_size" in p.pinned:
        return None
    smaller = [m for m in _micro_batches(p.geometry) if m <= p.settings.micro_batch_size // 2]
    return replace(p.settings, micro_batch_size=smaller[0]) if smaller else None


def _lower_utilization(p: Plan) -> Settings | None:
    # Disaggregated, vLLM's share is the rollout GPU's: the rollout side's ladder's.
    if (not p.geometry.is_gpu or "rollout_gpu_memory_utilization" in p.pinned
            or p.geometry.rollout is not None):
        return None
    floor = math.ceil(p.budget.rollout_min_utilization * 100) / 100
    new = round(max(floor, p.settings.rollout_gpu_memory_utilization - 0.1), 2)
    if new > p.settings.rollout_gpu_memory_utilization - 0.01:
        return None
    return replace(p.settings, rollout_gpu_memory_utilization=new)


def _most_utilization(p: Plan, settings: Settings) -> Settings | None:
    """``settings`` with vLLM's share raised to the most the update's residency under them
    leaves room for, or None when that is not more than the plan's."""
    if (not p.geometry.is_gpu or not p.geometry.uses_vllm
            or "rollout_gpu_memory_utilization" in p.pinned or p.geometry.rollout is not None):
        return None
    most = math.floor(max_rollout_utilization(p.geometry, settings) * 100) / 100
    if most < p.settings.rollout_gpu_memory_utilization + 0.01:
        return None
    return replace(settings, rollout_gpu_memory_utilization=most)


def _raise_utilization(p: Plan) -> Settings | None:
    # After a rollout OOM lowered it, the modelled most is what already ran out: only
    # freeing the update's residency (the next rungs) makes room for more.
    if "lower rollout GPU memory utilisation" in p.rungs:
        return None
    return _most_utilization(p, p.settings)


def _offload_for_kv_cache(knob: str) -> Rung:
    """Offload ``knob``'s state, and give vLLM the GPU memory it frees."""
    def rung(p: Plan) -> Settings | None:
        if getattr(p.settings, knob) or knob in p.pinned:
            return None
        switched: dict[str, Any] = {knob: True}
        return _most_utilization(p, replace(p.settings, **switched))

    rung.__name__ = f"{knob}_for_kv_cache"
    return rung


def _to_bf16(p: Plan) -> Settings | None:
    """Only when spec.recovery.allowPrecisionChange says so: bf16 changes the
    numerics, so it is the user's call; it comes before offloading, which keeps the
    numerics but slows every step. LoRA is never a rung: it changes what is trained."""
    g = p.geometry
    if not g.allow_precision_change or g.mode(p.settings) != MIXED:
        return None
    return replace(p.settings, precision=BF16)


def _switch(knob: str, value: bool) -> Rung:
    def rung(p: Plan) -> Settings | None:
        if getattr(p.settings, knob) == value or knob in p.pinned:
            return None
        switched: dict[str, Any] = {knob: value}
        return replace(p.settings, **switched)

    rung.__name__ = f"{knob}_{'on' if value else 'off'}"
    return rung


def _smaller_store(p: Plan) -> Settings | None:
    if "ray_object_store_gib" in p.pinned or p.settings.ray_object_store_gib <= STORE_MIN_GIB:
        return None
    return replace(
        p.settings, ray_object_store_gib=max(STORE_MIN_GIB, p.settings.ray_object_store_gib / 2)
    )


def _pod_to_allocatable(p: Plan) -> Settings | None:
    if p.settings.pod_memory_at_allocatable:
        return None
    return replace(p.settings, pod_memory_at_allocatable=True)


_CUDA: tuple[tuple[str, Rung], ...] = (
    ("gradient checkpointing on", _gc_on),
    ("halve micro-batch", _halve_micro_batch),
    ("lower rollout GPU memory utilisation", _lower_utilization),
    ("bf16 training", _to_bf16),
    ("offload optimizer", _switch("offload_optimizer", True)),
    ("offload params", _switch("offload_params", True)),
)
_HOST: tuple[tuple[str, Rung], ...] = (
    ("params offload off", _switch("offload_params", False)),
    ("optimizer offload off", _switch("offload_optimizer", False)),
    ("smaller Ray object store", _smaller_store),
    ("pod memory to node allocatable", _pod_to_allocatable),
)
# vLLM's KV cache too small at engine start (RankStage.KV_CACHE): more GPU memory for
# vLLM, never less; each rung keeps every GPU stage within the plan's margin
# (headroom.improves).
KV_CACHE_LADDER: tuple[tuple[str, Rung], ...] = (
    ("raise rollout GPU memory utilisation", _raise_utilization),
    ("offload optimizer for the KV cache", _offload_for_kv_cache("offload_optimizer")),
    ("offload params for the KV cache", _offload_for_kv_cache("offload_params")),
)
LADDERS: dict[FailureReason, tuple[tuple[str, Rung], ...]] = {
    FailureReason.CUDA_OOM: _CUDA,
    FailureReason.HOST_OOM: _HOST,
    FailureReason.RAY_OOM: _HOST,
}


def _ladder(failure: FailureReason,
            stage: RankStage | None) -> tuple[tuple[str, Rung], ...]:
    if failure is FailureReason.CUDA_OOM and stage is RankStage.KV_CACHE:
        return KV_CACHE_LADDER
    return LADDERS.get(failure, ())


def remediation_ladder(failure: FailureReason | str,
                       stage: RankStage | str | None = None) -> tuple[str, ...]:
    """The rung names for a failure class (and the rank stage it happened in), in order;
    empty when none applies."""
    return tuple(name for name, _ in _ladder(
        FailureReason(failure), RankStage(stage) if stage is not None else None))


def _acceptable(failure: FailureReason, budget: Budget) -> bool:
    if failure is FailureReason.CUDA_OOM:  # the GPU failed for real; guard the host
        return budget.peak_host_gib <= budget.host_capacity_gib
    gpu_ok = not budget.gpu_capacity_gib or budget.peak_gpu_gib <= budget.gpu_capacity_gib
    return gpu_ok


def next_safer_plan(
    plan_or_spec: Plan | GRPOJobSpec,
    failure: FailureReason | str,
    catalog: Mapping[str, GpuType] = GPU_CATALOG,
    model_config: dict[str, Any] | None = None,
    stage: RankStage | str | None = None,
    side: str | None = None,
) -> Plan | None:
    """The plan for the next attempt after `failure`, or None when the ladder is exhausted
    (or the failure class has no memory ladder). The applied rung is appended to
    `plan.remediations` as one line with the numbers. With the `stage` the ranks failed
    in, a CudaOOM's rung must relieve that stage (headroom.improves): a rollout OOM
    lowers vLLM's utilisation before anything that only helps the update."""
    failure = FailureReason(failure)
    stage = RankStage(stage) if stage is not None else None
    plan = (
        plan_or_spec
        if isinstance(plan_or_spec, Plan)
        else plan_memory(plan_or_spec, catalog, model_config)
    )
    # A disaggregated job's rollout side has its own ladder; the training one never runs
    # for its failures (planner/rollout_ladder.py).
    rollout = on_rollout_side(plan, stage, side)
    for name, rung in rollout_ladder(failure, stage) if rollout else _ladder(failure, stage):
        if name in plan.rungs:  # one restart per rung; the next failure moves on
            continue
        settings = rung(plan)
        if settings is None:
            continue
        budget = compute_budget(plan.geometry, settings)
        if not rollout and not _acceptable(failure, budget):
            continue
        safer = replan(plan, settings, "", name)
        if rollout and not changes_rollout_side(plan, safer):
            continue
        if not rollout and not improves(plan, safer, failure, stage):
            continue  # it would change nothing that helps
        # The note lists every difference between the two plans, not only the rung's
        # knob: a rung can move the rollout TP, a pod limit or Ray's store with it.
        note = (f"{failure.value}: {name}: {', '.join(plan_changes(plan, safer))} "
                f"(predicted GPU {plan.budget.peak_gpu_gib:.1f} -> {budget.peak_gpu_gib:.1f} "
                f"GiB, host {plan.budget.peak_host_gib:.1f} -> {budget.peak_host_gib:.1f} GiB)")
        return replace(safer, remediations=(*plan.remediations, note))
    return None
