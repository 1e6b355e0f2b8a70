"""An infeasible job's refusal: which candidate's peaks it quotes, the numbers behind
them, and the changes that would fit (suggestions.py), cheapest for the user first.

The search (core.py) walks the candidates from fastest to safest. Quoting the safest is
right when the GPUs never fit: its GPU peak is the least the planner reaches. But when
the GPUs fit and the host does not, the safest offloads everything to host RAM, and its
host peak is far above what the job needs; the refusal then quotes the cheapest
candidate whose GPUs fit, so the host peak it names is the one a fix must cover. Pure.
"""

from __future__ import annotations

from grpo_api.job.spec import GRPOJobSpec
from grpo_api.knobs import (
    GRADIENT_CHECKPOINTING,
    MICRO_BATCH_SIZE,
    MICRO_BATCH_TOKENS,
    ROLLOUT_GPU_MEMORY_UTILIZATION,
)

from .budget import HOST_HEADROOM, SYSTEM_RESERVED_FRACTION
from .mode_advice import Fits
from .modes import describe, mode_of
from .suggestions import ordered_suggestions
from .types import Budget, Geometry, InfeasibleError, Settings

Trail = list[tuple[Settings, Budget]]


def quoted(trail: Trail, pinned: frozenset[str]) -> tuple[Settings, Budget, str]:
    """The candidate a refusal quotes, and why that one: the cheapest whose GPUs fit
    (the margin kept, or not where the spec pins knobs, as the search accepts), else
    the safest."""
    for st, b in trail:
        if not b.gpu_problems(margin=not pinned):
            return st, b, "the cheapest settings whose GPUs fit"
    st, b = trail[-1]
    return st, b, "the safest settings the planner tries"


def _settings(st: Settings, geo: Geometry) -> str:
    offload = ("parameters and optimizer" if st.offload_params
               else "optimizer" if st.offload_optimizer else "nothing")
    batch = (f"{MICRO_BATCH_TOKENS.spec} {st.micro_batch_tokens}" if st.micro_batch_tokens
             else f"{MICRO_BATCH_SIZE.spec} {st.micro_batch_size}")
    util = (f", {ROLLOUT_GPU_MEMORY_UTILIZATION.spec} {st.rollout_gpu_memory_utilization:.2f}"
            if geo.is_gpu and geo.rollout is None else "")
    return (f"{GRADIENT_CHECKPOINTING.spec} {str(st.gradient_checkpointing).lower()}, {batch}, "
            f"offload {offload}{util}")


def _terms(terms: dict[str, float]) -> str:
    top = sorted(terms.items(), key=lambda kv: -kv[1])[:4]
    return ", ".join(f"{k} {v:.1f} GiB" for k, v in top)


def host_usable(geo: Geometry, b: Budget, spec: GRPOJobSpec) -> str:
    """How the usable host memory follows from the node's, in words."""
    where = ("resources.hostMemory" if spec.resources.host_memory
             else f"the RAM of a {geo.gpu} node, the catalog's")
    share = f" x {geo.node_share:g} (its share of the node's GPUs)" if geo.node_share < 1 else ""
    return (f"host usable per node: {geo.host_memory_gib:.1f} GiB ({where}){share} x "
            f"{1 - SYSTEM_RESERVED_FRACTION:.2f} allocatable x {HOST_HEADROOM:.2f} headroom "
            f"(Ray kills at 95%) = {b.host_capacity_gib:.1f} GiB")


def numbers(geo: Geometry, spec: GRPOJobSpec, trail: Trail,
            pinned: frozenset[str]) -> list[str]:
    """The quoted candidate's settings, what does not fit, and the terms behind each
    peak it names."""
    st, b, why = quoted(trail, pinned)
    out = [f"quoted: {why} ({_settings(st, geo)})", *b.problems()]
    stage = b.gpu_stages.get(b.peak_gpu_stage, {})
    if stage:
        out.append(f"largest GPU terms ({b.peak_gpu_stage}): {_terms(stage)}")
    out.append(f"largest host terms ({b.host_peak_stage}): {_terms(b.host_peak_terms)}")
    if b.host_problems():
        out.append(host_usable(geo, b, spec))
    return out


def infeasible(geo: Geometry, spec: GRPOJobSpec, pinned: frozenset[str], trail: Trail,
               fits: Fits, max_nodes: int, derived: bool = False) -> InfeasibleError:
    """The refusal: the summary, the quoted peaks (`trail`: the candidates the search
    tried on `geo`), and every change that would fit, cheapest first."""
    where = (
        f"{spec.model.path} ({geo.shape.parameters / 1e9:.1f}B) on "
        f"{max(1, geo.nodes)} x {geo.gpus_per_node} {geo.gpu}"
    )
    mode = describe(mode_of(spec.training.precision, geo.lora))
    host_bound = bool(trail) and not quoted(trail, pinned)[1].gpu_problems(margin=not pinned)
    summary = f"infeasible: {where} in {mode} does not fit " + (
        "in host memory: the settings that fit its GPUs need more than the nodes give"
        if host_bound else "even with the safest settings")
    if derived:
        summary = (f"infeasible: {spec.model.path} does not fit on up to {max_nodes} nodes "
                   f"(the peaks below: on {max(1, geo.nodes)})")
    return InfeasibleError(summary, numbers(geo, spec, trail, pinned) if trail else [],
                           ordered_suggestions(geo, spec, pinned, fits, max_nodes, derived))
