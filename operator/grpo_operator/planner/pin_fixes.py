"""What a refusal proposes first: for each knob the spec pins, the nearest value that
fits with the rest of the spec as it is. A pinned knob is the user's own choice, so
moving it (rolloutGpuMemoryUtilization 0.90 -> 0.72) is the least they can change:
less than unpinning every knob, and far less than more GPUs or another training mode.
Each value is found with the planner's own fit test (core passes it in), so planning
the spec with it fits. Pure.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from grpo_api.job.base import quantity_gib
from grpo_api.job.resources import MemorySpec
from grpo_api.job.spec import GRPOJobSpec
from grpo_api.knobs import PINNABLE

from .mode_advice import Fits
from .stage_terms import compute_budget
from .types import Geometry, Settings

# The knobs by what moving them costs: vLLM's share and the micro-batch only move
# memory between stages, the object store only bounds a buffer; recomputation costs a
# third more compute, loading on every rank host RAM, offload every step's time.
ORDER = ("rollout_gpu_memory_utilization", "micro_batch_tokens", "micro_batch_size",
         "ray_object_store_gib", "gradient_checkpointing", "rank0_init",
         "offload_optimizer", "offload_params")
UTILIZATION_GRID = tuple(i / 100 for i in range(10, 96))  # the schema's 0.10 .. 0.95
UTILIZATION = "rollout_gpu_memory_utilization"

Try = Callable[[Any], Settings | None]


def memory_field(setting: str) -> str:
    """The MemorySpec attribute that pins a Settings field (they differ for the store)."""
    return next(name for name, f in MemorySpec.model_fields.items()
                if f.alias == PINNABLE[setting])


def with_memory(spec: GRPOJobSpec, setting: str, value: Any) -> GRPOJobSpec:
    """The spec with one spec.memory field set to `value`."""
    memory = spec.memory.model_copy(update={memory_field(setting): value})
    return spec.model_copy(update={"memory": memory})


def _largest(lo: int, hi: int, attempt: Try) -> tuple[int, Settings] | None:
    """The largest n in [lo, hi] that fits, for a knob where less always needs less
    memory (a bisection: the fit test is monotone in it)."""
    best: tuple[int, Settings] | None = None
    while lo <= hi:
        mid = (lo + hi) // 2
        if (st := attempt(mid)) is not None:
            best, lo = (mid, st), mid + 1
        else:
            hi = mid - 1
    return best


def _nearest(values: list[Any], attempt: Try) -> tuple[Any, Settings] | None:
    """The first of `values` (nearest first) that fits."""
    for value in values:
        if (st := attempt(value)) is not None:
            return value, st
    return None


def _fix(geo: Geometry, spec: GRPOJobSpec, setting: str,
         attempt: Try) -> tuple[Any, Settings] | None:
    now = getattr(spec.memory, memory_field(setting))
    if setting == UTILIZATION:  # too high starves the actor, too low vLLM: both ways
        grid = [u for u in UTILIZATION_GRID if abs(u - now) > 1e-9]
        return _nearest(sorted(grid, key=lambda u: (abs(u - now), u)), attempt)
    if isinstance(now, bool):
        return _nearest([not now], attempt)
    if setting == "micro_batch_tokens":  # at least one whole sample (the spec's rule)
        return _largest(geo.sequence_length, now - 1, attempt)
    if setting == "micro_batch_size":
        return _largest(1, now - 1, attempt)
    # The object store, in whole GiB below the pinned size.
    found = _largest(1, math.ceil(quantity_gib(now)) - 1, lambda n: attempt(f"{n}Gi"))
    return (f"{found[0]}Gi", found[1]) if found else None


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def peaks(geo: Geometry, st: Settings) -> str:
    """The peaks a fitting plan reaches, for the reader to weigh a fix by."""
    b = compute_budget(geo, st)
    host = (f"host peak {b.peak_host_gib:.1f} of {b.host_capacity_gib:.1f} GiB usable per "
            "node")
    if not geo.is_gpu:
        return host
    return (f"GPU {b.peak_gpu_stage} peak {b.peak_gpu_gib:.1f} of {b.gpu_capacity_gib:.1f} "
            f"GiB usable per GPU, {host}")


def pinned_value_fixes(geo: Geometry, spec: GRPOJobSpec, pinned: frozenset[str],
                       fits: Fits) -> list[str]:
    """One line per pinned knob with a value that fits the others as pinned: the value
    nearest the pinned one (for rolloutGpuMemoryUtilization the highest below it, or the
    lowest above it) and the peaks the plan then reaches."""
    out = []
    for setting in (s for s in ORDER if s in pinned):
        now = getattr(spec.memory, memory_field(setting))

        def attempt(value: Any, setting: str = setting) -> Settings | None:
            return fits(geo, with_memory(spec, setting, value), pinned)

        found = _fix(geo, spec, setting, attempt)
        if found is None:
            continue
        value, st = found
        others = ", the other knobs as pinned" if len(pinned) > 1 else ""
        out.append(f"memory.{PINNABLE[setting]}: {_show(value)} instead of {_show(now)} "
                   f"({_which(setting, value, now)}{others}; {peaks(geo, st)})")
    return out


def _which(setting: str, value: Any, now: Any) -> str:
    if isinstance(value, bool):
        return "fits"
    if setting == UTILIZATION:
        return "the highest that fits" if value < now else "the lowest that fits"
    return "the largest that fits"
