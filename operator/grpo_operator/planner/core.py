"""plan_memory: choose the cheapest memory settings that fit, and size the cluster.

Search order (cheapest first; the same order the CudaOOM ladder walks after a failure):
  1. everything fast: no gradient checkpointing, the largest micro-batch, no offload: by
     tokens, the rank's whole mini-batch in the shared-prefix layout (planner/layout.py);
     by samples (a spec that pins microBatchSize), <= 4;
  2. gradient checkpointing on (~1/3 more compute, activations shrink ~10x);
  3. halve the micro-batch (its token budget), down to one whole sample;
  4. offload the optimizer to host RAM, only if the host has room;
  5. offload parameters too, only if the host has room.
Generations per prompt (rolloutN) are never changed by the planner or the recovery
ladder: that changes the algorithm (planner/ladder.py says why it is not a rung).
rank-0 init is on for every multi-rank job (N ranks must never each hold the whole
model), and the vLLM memory fraction is whatever the actor leaves free during rollout.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from grpo_api.catalog import GPU_CATALOG, GpuType, UnknownGpuType, gpu_type
from grpo_api.job import SpecError
from grpo_api.job.base import quantity_gib
from grpo_api.job.resources import ResourcesSpec
from grpo_api.job.spec import GRPOJobSpec
from grpo_api.knobs import PINNABLE
from grpo_api.model.shape import Shape, resolve_shape

from .disaggregated import choose_split, rollout_side, rollout_type, side_decisions
from .layout import token_budgets
from .mode_advice import without_offload
from .modes import lora_plan
from .network import plan_network
from .positions import context_decision, context_problem, model_positions
from .reasons import explain, explain_margin, explain_pods
from .refusal import Trail, infeasible, numbers
from .resources import (
    at_least,
    build_env,
    build_pods,
    build_rollout_pod,
    object_store_gib,
    ray_start_params,
)
from .stage_terms import compute_budget, max_rollout_utilization
from .types import Budget, Geometry, InfeasibleError, Plan, Settings

MAX_MICRO_BATCH = 4
MAX_AUTO_NODES = 64
MAX_UTILIZATION = 0.90
CPU_DEFAULT_RANKS = 2


def _micro_batches(geo: Geometry) -> list[int]:
    """Divisors of the per-rank update batch, <= MAX_MICRO_BATCH, largest first."""
    per_rank = geo.global_batch_size // geo.world_size
    return [d for d in range(min(MAX_MICRO_BATCH, per_rank), 0, -1) if per_rank % d == 0]


def _pinned(spec: GRPOJobSpec) -> frozenset[str]:
    """The Settings fields the spec sets (spec.memory by the names users write)."""
    memory = spec.memory.model_dump(by_alias=True)
    return frozenset(setting for setting, name in PINNABLE.items() if memory[name] is not None)


def with_auto_utilization(geo: Geometry, st: Settings, pinned: frozenset[str]) -> Settings:
    if not geo.is_gpu or "rollout_gpu_memory_utilization" in pinned:
        return st
    util = min(MAX_UTILIZATION, max_rollout_utilization(geo, st))
    return replace(st, rollout_gpu_memory_utilization=max(0.05, int(util * 100) / 100))


def _candidates(geo: Geometry, start: Settings, pinned: frozenset[str]) -> list[Settings]:
    """Settings from fastest to safest, following the documented order."""
    out = [start]
    st = start
    if "gradient_checkpointing" not in pinned and not st.gradient_checkpointing:
        st = replace(st, gradient_checkpointing=True)
        out.append(st)
    if st.micro_batch_tokens and "micro_batch_tokens" not in pinned:
        for tokens in token_budgets(geo, st.rollout_n):
            if tokens < st.micro_batch_tokens:
                st = replace(st, micro_batch_tokens=tokens)
                out.append(st)
    elif not st.micro_batch_tokens and "micro_batch_size" not in pinned:
        for mb in _micro_batches(geo):
            if mb < st.micro_batch_size:
                st = replace(st, micro_batch_size=mb)
                out.append(st)
    for knob in ("offload_optimizer", "offload_params"):
        if knob not in pinned and not getattr(st, knob):
            on: dict[str, Any] = {knob: True}
            st = replace(st, **on)
            out.append(st)
    return out


def initial_settings(geo: Geometry, spec: GRPOJobSpec) -> Settings:
    m = spec.memory
    mbs = _micro_batches(geo)
    store = (
        quantity_gib(m.ray_object_store_memory)
        if m.ray_object_store_memory
        else object_store_gib(geo, spec.algorithm.rollout_n)
    )
    # By tokens unless the spec asks for samples (microBatchSize alone).
    by_samples = m.micro_batch_size is not None and m.micro_batch_tokens is None
    tokens = m.micro_batch_tokens or token_budgets(geo, spec.algorithm.rollout_n)[0]
    return Settings(
        rank0_init=m.rank0_init if m.rank0_init is not None else geo.world_size > 1,
        offload_params=bool(m.offload_params),
        offload_optimizer=bool(m.offload_optimizer),
        gradient_checkpointing=bool(m.gradient_checkpointing),
        micro_batch_size=m.micro_batch_size or (mbs[0] if mbs else 1),
        rollout_gpu_memory_utilization=m.rollout_gpu_memory_utilization or 0.5,
        rollout_n=spec.algorithm.rollout_n,
        ray_object_store_gib=store,
        precision=spec.training.precision,
        micro_batch_tokens=0 if by_samples else tokens,
    )


def _search(
    geo: Geometry, spec: GRPOJobSpec, pinned: frozenset[str]
) -> tuple[Settings | None, Budget | None, Trail]:
    """First candidate that fits with the margin kept (or None), and the trail of those
    that did not. When none does and the spec pins memory knobs, the first that fits
    inside the margin: pinned settings are the user's call (the plan says so)."""
    trail: Trail = []
    inside_margin: tuple[Settings, Budget, Trail] | None = None
    for cand in _candidates(geo, initial_settings(geo, spec), pinned):
        cand = with_auto_utilization(geo, cand, pinned)
        budget = compute_budget(geo, cand)
        if budget.fits:
            return cand, budget, trail
        if pinned and inside_margin is None and budget.fits_without_margin:
            inside_margin = (cand, budget, list(trail))
        trail.append((cand, budget))
    if inside_margin is not None:
        return inside_margin
    return None, None, trail


def search(
    geo: Geometry, spec: GRPOJobSpec, pinned: frozenset[str]
) -> tuple[Settings, Budget, Trail]:
    """Like _search, but an infeasible job raises with the numbers and the fixes."""
    settings, budget, trail = _search(geo, spec, pinned)
    if settings is None or budget is None:
        raise infeasible(geo, spec, pinned, trail, _fits, MAX_AUTO_NODES)
    return settings, budget, trail


def _node_source(r: ResourcesSpec, gpu: GpuType) -> str:
    """Where the node's RAM and CPUs the plan sizes pods for come from."""
    own = [f for f, v in (("hostMemory", r.host_memory), ("cpusPerNode", r.cpus_per_node))
           if v]
    if len(own) == 2 or not gpu.is_gpu:
        return f"spec.resources.{' and '.join(own)}" if own else "the head pod (cpu)"
    return f"spec.resources.{own[0]}, the rest: {gpu.node_source}" if own else gpu.node_source


def geometry(
    spec: GRPOJobSpec,
    catalog: Mapping[str, GpuType],
    shape: Shape,
    shape_source: str,
    nodes: int,
    rollout_nodes: int | None = None,
) -> Geometry:
    """`rollout_nodes`: a disaggregated job's rollout nodes when the split chose them
    (else the spec's)."""
    r, gpu = spec.resources, catalog[spec.resources.gpu_type]
    dis = spec.rollout.disaggregated
    side = None
    if dis is not None:
        count = rollout_nodes or dis.nodes
        assert count is not None, "the split chooses the rollout nodes first"
        side = rollout_side(spec, catalog, count, "spec.rollout.disaggregated.nodes"
                            if rollout_nodes is None else "split")
    gpn = r.gpus_per_node or (gpu.gpus_per_node if gpu.is_gpu else CPU_DEFAULT_RANKS)
    return Geometry(
        model_path=spec.model.path,
        shape=shape,
        shape_source=shape_source,
        gpu=gpu.name,
        gpu_memory_gib=gpu.memory_gib,
        nodes=nodes,
        gpus_per_node=gpn,
        node_gpus=gpu.gpus_per_node,
        host_memory_gib=quantity_gib(r.host_memory) if r.host_memory else gpu.host_memory_gib,
        cpus_per_node=r.cpus_per_node or gpu.cpus,
        node_source=_node_source(r, gpu),
        product_label=gpu.product_label,
        sequence_length=spec.data.max_prompt_length + spec.data.max_response_length,
        response_length=spec.data.max_response_length,
        max_pixels=spec.data.max_pixels,
        rollout_batch_size=spec.training.rollout_batch_size,
        global_batch_size=spec.training.global_batch_size,
        kl_coef=spec.algorithm.kl_coef,
        rollout_engine=(
            ("vllm" if gpu.is_gpu else "hf")
            if spec.rollout.engine == "auto"
            else spec.rollout.engine
        ),
        async_save=spec.checkpoint.async_save,
        devices=dict(r.devices or {}),
        fabric=gpu.fabric,
        user_env=frozenset(
            e.name
            for section in (spec.pods.common, spec.pods.head, spec.pods.workers)
            for e in section.env or []
        ),
        lora=lora_plan(shape, spec.lora) if spec.lora is not None else None,
        allow_precision_change=spec.recovery.allow_precision_change,
        max_images_per_prompt=spec.data.max_images_per_prompt,
        max_videos_per_prompt=spec.data.max_videos_per_prompt,
        max_frames=spec.data.max_frames,
        video_max_pixels=spec.data.video_max_pixels,
        data_rows=spec.data.rows,
        prompt_lengths=spec.data.prompt_lengths,
        spec_rollout_n=spec.algorithm.rollout_n,
        rollout=side,
    )


def _check_batch(geo: Geometry) -> str | None:
    world, batch = geo.world_size, geo.global_batch_size
    if batch % world:
        below, above = batch // world * world, (batch // world + 1) * world
        return (
            f"training.globalBatchSize {batch} is not a multiple of the world size {world} "
            f"({max(1, geo.nodes)} x {geo.gpus_per_node}); every rank needs the same number "
            f"of samples per update. Fix: training.globalBatchSize: {above}"
            + (f" or {below}" if below else "") + ", or a world size that divides it"
        )
    return None


def _fits(geo: Geometry, spec: GRPOJobSpec, pinned: frozenset[str]) -> Settings | None:
    """The settings that fit, or None; never computes suggestions (no recursion)."""
    if _check_batch(geo):
        return None
    return _search(geo, spec, pinned)[0]


def _derive_nodes(
    spec: GRPOJobSpec, catalog: Mapping[str, GpuType], shape: Shape, source: str
) -> tuple[int, str]:
    """Fewest nodes that fit without offload; else fewest that fit at all."""
    pinned = _pinned(spec)
    fallback: int | None = None
    for n in range(1, MAX_AUTO_NODES + 1):
        geo = geometry(spec, catalog, shape, source, n)
        st = _fits(geo, spec, pinned)
        if st is None:
            continue
        if not (st.offload_params or st.offload_optimizer):
            return n, f"fewest nodes whose plan fits without offload ({n})"
        fallback = fallback or n
    if fallback is not None:
        return fallback, f"fewest nodes that fit at all ({fallback}); offload needed"
    # The peaks quoted: on the most nodes tried that split the batch evenly.
    gpn = geometry(spec, catalog, shape, source, 1).gpus_per_node
    most = max((n for n in range(1, MAX_AUTO_NODES + 1)
                if spec.training.global_batch_size % (n * gpn) == 0), default=1)
    geo = geometry(spec, catalog, shape, source, most)
    raise infeasible(geo, spec, pinned, _search(geo, spec, pinned)[2], _fits,
                     MAX_AUTO_NODES, derived=True)


def node_type(spec: GRPOJobSpec, catalog: Mapping[str, GpuType]) -> GpuType:
    """The spec's GPU type as the catalog in use has it (built in + the chart's
    gpuCatalog), or SpecError naming the field: a type it does not have (the known ones
    listed), or more GPUs per worker than that type's nodes have (a worker pod runs on
    one node, so it would wait in Pending for a node that does not exist)."""
    r = spec.resources
    try:
        gpu = gpu_type(r.gpu_type, catalog)
    except UnknownGpuType as exc:
        raise SpecError([f"spec.resources.gpuType: {exc}"]) from None
    if gpu.is_gpu and r.gpus_per_node is not None and r.gpus_per_node > gpu.gpus_per_node:
        per_node = gpu.gpus_per_node
        total = (r.nodes or 1) * r.gpus_per_node
        same = (f"resources.nodes: {total // per_node} with gpusPerNode: {per_node} for the "
                f"same {total} GPUs" if total % per_node == 0 else
                f"gpusPerNode: {per_node} or fewer, with more resources.nodes")
        raise SpecError([
            f"spec.resources.gpusPerNode: {r.gpus_per_node} is more than the {per_node} GPUs "
            f"a {gpu.name} node has (the operator's GPU catalog; the chart's gpuCatalog "
            "sets gpusPerNode per type): a worker pod runs on one node, so it would stay "
            f"Pending; use {same}"])
    return gpu


def plan_memory(
    spec: GRPOJobSpec,
    catalog: Mapping[str, GpuType] = GPU_CATALOG,
    model_config: dict[str, Any] | None = None,
    model_source: str | None = None,
) -> Plan:
    """The whole plan for a spec. Raises InfeasibleError (numbers + smallest fix),
    SpecError (node_type: a GPU type or per-node count the catalog does not have) or
    ValueError (a model that cannot be sized; its subclass UnsupportedArchitecture for a
    config.json the trainer cannot train). `model_source`: where `model_config` was read,
    or why there is none (grpo_api.model.shape.resolve_shape)."""
    gpu = node_type(spec, catalog)
    resolved = resolve_shape(spec.model, model_config, model_source)
    # The context against the model's positions, before any memory: no plan makes a
    # sample longer than the model's positions run (positions.py).
    positions = model_positions(model_config) if spec.model.shape is None else None
    if positions is not None and (problem := context_problem(spec, positions,
                                                             resolved.source)):
        raise SpecError([problem])
    nodes_reason = "spec.resources.nodes"
    dis, rollout_nodes, split_reason = spec.rollout.disaggregated, None, ""
    if dis is not None:
        rollout_type(spec, catalog)  # SpecError for a type the catalog lacks, first
    if dis is not None and dis.nodes is None:  # the planner splits resources.nodes
        nodes, rollout_nodes, split_reason = choose_split(
            spec, catalog, resolved.shape, gpu,
            lambda t, r: geometry(spec, catalog, resolved.shape, resolved.source, t, r),
            lambda g: _fits(g, spec, _pinned(spec)) is not None,
            lambda g: numbers(g, spec, _search(g, spec, _pinned(spec))[2], _pinned(spec)))
        nodes_reason = f"spec.resources.nodes less the {rollout_nodes} that generate"
    elif spec.resources.nodes is not None:
        nodes = spec.resources.nodes
    elif not gpu.is_gpu:
        nodes, nodes_reason = 0, "cpu job: the head pod runs the ranks"
    else:
        nodes, nodes_reason = _derive_nodes(spec, catalog, resolved.shape, resolved.source)
    geo = geometry(spec, catalog, resolved.shape, resolved.source, nodes, rollout_nodes)
    problem = _check_batch(geo)
    if problem:
        raise InfeasibleError(f"infeasible: {problem}", [], [])
    pinned = _pinned(spec)
    settings, budget, trail = search(geo, spec, pinned)
    pods = build_pods(geo, settings, budget)
    decisions = explain(geo, settings, budget, trail, pinned, nodes_reason)
    if positions is not None:  # beside the model line
        decisions.insert(1, context_decision(spec, positions, resolved.source))
    decisions.append(explain_margin(geo, budget, pinned))
    for extra in (plan_network(geo).decision,
                  without_offload(geo, spec, settings, pinned, _fits) if geo.is_gpu else None):
        if extra is not None:
            decisions.append(extra)
    rollout = build_rollout_pod(geo, settings, budget)
    decisions.extend(side_decisions(geo, budget, rollout, split_reason))
    return Plan(
        geometry=geo,
        settings=settings,
        budget=budget,
        pinned=pinned,
        decisions=(*decisions, *explain_pods(geo, pods, budget)),
        head=pods.head,
        worker=pods.worker,
        rank0=pods.rank0,
        env=build_env(geo, settings),
        ray_start_params=ray_start_params(geo, settings),
        rollout=rollout,
        rollout_ray_start_params=ray_start_params(geo, settings, rollout=True),
    )


def replan(plan: Plan, settings: Settings, note: str, rung: str = "") -> Plan:
    """The same job with other settings (used by the remediation ladder); no pod limit
    below the plan it replaces."""
    geo = plan.geometry
    budget = compute_budget(geo, settings)
    pods = build_pods(geo, settings, budget)
    kept_head = at_least(pods.head, plan.head)
    assert kept_head is not None
    return replace(
        plan,
        settings=settings,
        budget=budget,
        head=kept_head,
        worker=at_least(pods.worker, plan.worker),
        rank0=at_least(pods.rank0, plan.rank0),
        env=build_env(geo, settings),
        ray_start_params=ray_start_params(geo, settings),
        rollout=at_least(build_rollout_pod(geo, settings, budget), plan.rollout),
        rollout_ray_start_params=ray_start_params(geo, settings, rollout=True),
        remediations=(*plan.remediations, note),
        rungs=(*plan.rungs, rung) if rung else plan.rungs,
    )
