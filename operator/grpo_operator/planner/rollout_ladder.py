"""Remediation on a disaggregated job's rollout side: the rollout GPUs hold vLLM alone,
so none of the training ladder's rungs (checkpointing, micro-batch, offload, precision)
can relieve them, and none of them is tried; these act on the rollout side only.

CudaOOM (generation):       lower rollout GPU memory utilisation (vLLM's activations and
                            sampler get the room)
CudaOOM (kv_cache at start): none: an engine apart runs at tensor parallel 1
                            (grpo_api.trainer_config.ENGINE_APART_TENSOR_PARALLEL), so
                            no rung gives its GPU less of the weights
HostOOM/RayOOM:             rollout pod memory to node allocatable

A rung applies once, leaves alone what the spec pinned (memory.
rolloutGpuMemoryUtilization), and is kept only if the rollout GPU still fits
(planner/rollout_side.RolloutBudget.problems).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from grpo_api.contract import RAY_SIDE_ROLLOUT, FailureReason, RankStage

from .types import Plan, Settings

Rung = Callable[[Plan], Settings | None]


def on_rollout_side(plan: Plan, stage: RankStage | None, side: str | None) -> bool:
    """Whether a failure is the rollout side's: a rollout pod ended (side), or the
    ranks failed generating in a disaggregated job (its training GPUs never generate)."""
    if plan.geometry.rollout is None:
        return False
    return side == RAY_SIDE_ROLLOUT or stage in (RankStage.ROLLOUT, RankStage.KV_CACHE)


def _lower_utilization(p: Plan) -> Settings | None:
    rb = p.budget.rollout_side
    if rb is None or "rollout_gpu_memory_utilization" in p.pinned:
        return None
    floor = math.ceil(rb.min_utilization * 100) / 100
    new = round(max(floor, p.settings.rollout_gpu_memory_utilization - 0.1), 2)
    if new > p.settings.rollout_gpu_memory_utilization - 0.01:
        return None
    return replace(p.settings, rollout_gpu_memory_utilization=new)


def _pod_to_allocatable(p: Plan) -> Settings | None:
    if p.rollout is None or p.settings.rollout_pod_memory_at_allocatable:
        return None
    return replace(p.settings, rollout_pod_memory_at_allocatable=True)


_CUDA: tuple[tuple[str, Rung], ...] = (
    ("lower rollout-side GPU memory utilisation", _lower_utilization),
)
_KV_CACHE: tuple[tuple[str, Rung], ...] = ()
_HOST: tuple[tuple[str, Rung], ...] = (
    ("rollout pod memory to node allocatable", _pod_to_allocatable),
)


def rollout_ladder(failure: FailureReason,
                   stage: RankStage | None) -> tuple[tuple[str, Rung], ...]:
    if failure is FailureReason.CUDA_OOM:
        return _KV_CACHE if stage is RankStage.KV_CACHE else _CUDA
    if failure in (FailureReason.HOST_OOM, FailureReason.RAY_OOM):
        return _HOST
    return ()


def changes_rollout_side(old: Plan, new: Plan) -> bool:
    """Whether a rung changed the rollout side and left its GPU fitting."""
    a, b = old.budget.rollout_side, new.budget.rollout_side
    if b is None or b.problems(margin=False):
        return False
    pods = (old.rollout.memory_gib if old.rollout else 0,
            new.rollout.memory_gib if new.rollout else 0)
    return a != b or pods[0] != pods[1]
