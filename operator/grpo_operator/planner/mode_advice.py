"""What a refusal proposes besides more or bigger GPUs: a cheaper training mode.

For a job that does not fit, each mode that keeps more of the job comes first: bf16
training (still full fine-tuning) before LoRA (trains an adapter instead). A mode that
fits on the job's own GPUs is said so, with its peak and the fewest GPUs it needs; one
that needs more nodes says how many; one that fits only by offloading says what it moves
to host RAM and the host peak that needs. A LoRA job has no cheaper mode to propose.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from grpo_api.job.lora import LoraSpec
from grpo_api.job.spec import GRPOJobSpec

from .modes import BF16, LORA, ORDER, Mode, describe, lora_plan, mode_of
from .stage_terms import compute_budget
from .types import Decision, Geometry, Settings

Fits = Callable[[Geometry, GRPOJobSpec, frozenset[str]], Settings | None]


def in_mode(geo: Geometry, spec: GRPOJobSpec, mode: Mode) -> tuple[Geometry, GRPOJobSpec]:
    """The same job in another mode: bf16 full fine-tuning, or LoRA (the spec's adapter,
    else the defaults: rank 32 on every linear of the language model)."""
    precision = "bf16" if mode == BF16 else "mixed"
    lora = (spec.lora or LoraSpec.model_validate({})) if mode == LORA else None
    training = spec.training.model_copy(update={"precision": precision})
    other = spec.model_copy(update={"training": training, "lora": lora})
    return replace(geo, lora=lora_plan(geo.shape, lora) if lora else None), other


def _how(mode: Mode) -> str:
    if mode == BF16:
        return "set spec.training.precision: bf16"
    return "add spec.lora: {} (rank 32 on every linear layer of the language model)"


def offload_cost(geo: Geometry, st: Settings) -> str:
    """What a plan that offloads costs in host RAM, in words ("" when it offloads
    nothing): a mode that fits only by moving its state to host RAM is not the same
    advice as one that holds it on the GPU."""
    if not (st.offload_params or st.offload_optimizer):
        return ""
    what = ("parameters, gradients and optimizer state" if st.offload_params
            else "optimizer state")
    b = compute_budget(geo, st)
    return (f" by offloading its {what} to host RAM (host peak {b.peak_host_gib:.1f} of "
            f"{b.host_capacity_gib:.1f} GiB per node; slower steps)")


def _fewest_gpus(geo: Geometry, spec: GRPOJobSpec, pinned: frozenset[str], fits: Fits) -> str:
    """The smallest shape (nodes x GPUs per node, at most the job's) that fits, if any is
    smaller than the job's."""
    shapes = sorted(
        ((n, g) for n in range(1, max(1, geo.nodes) + 1) for g in range(1, geo.gpus_per_node + 1)
         if n * g < geo.world_size),
        key=lambda ng: (ng[0] * ng[1], ng[0]),
    )
    for n, g in shapes:
        smaller = replace(geo, nodes=n, gpus_per_node=g)
        if (st := fits(smaller, spec, pinned)) is not None:
            return (f"; it needs only {n * g} (resources.nodes: {n}, gpusPerNode: {g})"
                    f"{offload_cost(smaller, st)}")
    return ""


def mode_suggestions(
    geo: Geometry,
    spec: GRPOJobSpec,
    pinned: frozenset[str],
    fits: Fits,
    max_nodes: int,
    derived: bool = False,
) -> list[str]:
    """One line per cheaper mode that fits, least change first."""
    current = mode_of(spec.training.precision, geo.lora)
    out = []
    for mode in ORDER[ORDER.index(current) + 1:]:
        g, s = in_mode(geo, spec, mode)
        name = describe(mode)
        st = None if derived else fits(g, s, pinned)
        if st is not None:
            b = compute_budget(g, st)
            # The training peak: the rollout stage is filled up to what vLLM may take.
            where = (
                f"{geo.world_size} GPUs (training peak "
                f"{sum(b.gpu_stages['training'].values()):.1f} of {b.gpu_capacity_gib:.1f} GiB "
                f"per GPU{_fewest_gpus(g, s, pinned, fits)})"
                if geo.is_gpu
                else f"{geo.world_size} CPU ranks (host peak {b.peak_host_gib:.1f} of "
                f"{b.host_capacity_gib:.1f} GiB)"
            )
            out.append(f"{name} fits on your {where}{offload_cost(g, st)}: {_how(mode)}")
            continue
        first = 1 if derived else max(1, geo.nodes) + 1
        for n in range(first, max_nodes + 1):
            more = replace(g, nodes=n)
            if (st := fits(more, s, pinned)) is not None:
                out.append(
                    f"{name} fits on {n} node{'s' if n > 1 else ''} "
                    f"({n * geo.gpus_per_node} {'GPUs' if geo.is_gpu else 'CPU ranks'})"
                    f"{offload_cost(more, st)}: {_how(mode)}, resources.nodes: {n}"
                )
                break
    return out


OFFLOAD = frozenset({"offload_params", "offload_optimizer"})


def without_offload(
    geo: Geometry, spec: GRPOJobSpec, st: Settings, pinned: frozenset[str], fits: Fits
) -> Decision | None:
    """When the plan offloads (slower steps) and a cheaper mode would hold everything on
    the GPU, say which: the job fits, so nothing is refused, but the user should know."""
    if not (st.offload_params or st.offload_optimizer) or OFFLOAD & pinned:
        return None
    current = mode_of(spec.training.precision, geo.lora)
    for mode in ORDER[ORDER.index(current) + 1:]:
        g, s = in_mode(geo, spec, mode)
        other = fits(g, s, pinned | OFFLOAD)  # offload pinned off, as spec.memory has it
        if other is not None:
            train = sum(compute_budget(g, other).gpu_stages.get("training", {}).values())
            return Decision(
                "cheaperMode",
                mode,
                "auto",
                f"{describe(mode)} would fit these GPUs without offload (training peak "
                f"{train:.1f} GiB per GPU): {_how(mode)}; the plan keeps "
                f"{describe(current)} as the spec says and offloads instead",
            )
    return None
