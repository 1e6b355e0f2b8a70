"""The budget as a table of terms: one builder per memory stage and deployment shape.

``compute_budget`` assembles a ``Budget`` from them: the training GPU's stages (load,
training, the root unit's gather, the optimizer step), the rollout's (colocated vLLM or
the transformers engine, or a rollout side of its own), the host's steady terms and the
host while rank 0 loads. Every term is named (the key ``grpo plan``, ``status.plan`` and
the plan-equals-tensors test read) and computed once, here; the formulas and constants
are budget.py's, derived in docs/memory-model.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from grpo_api.model.units import BF16_B, FP32_B, GIB

from .budget import (
    CUDA_CONTEXT_GIB,
    GPU_USABLE,
    HOST_HEADROOM,
    LOAD_OVERHEAD,
    RANK_PROCESS_CPU_GIB,
    RANK_PROCESS_GIB,
    SYSTEM_RESERVED_FRACTION,
    VLLM_CUDA_GRAPHS_GIB,
    VLLM_OVERHEAD_GIB,
    _factor,
    _pinned_gib,
    _state_gib,
    _term_gib,
    actor_state,
    card_margin_gib,
    cpu_engine_gib,
    gpu_margin_gib,
    host_capacity_gib,
    rollout_tensor_parallel,
)
from .fsdp import fsdp_buffers, trained
from .head import driver_gib
from .layout import attention_layout_bytes, micro_batch
from .modes import FROZEN, GRADS, LORA, OPTIMIZER, STATE, WEIGHTS
from .rollout_side import RolloutBudget, RolloutSide, cpu_rollout_budget, rollout_budget
from .sizes import (
    activation_bytes_per_token,
    compute_bytes,
    kv_bytes_per_token,
    logprob_bytes,
    vision_activation_bytes,
    weight_sync_bytes,
)
from .types import RANK0_LOAD_TERM, Budget, Geometry, Settings

Terms = dict[str, float]  # term name -> GiB


@dataclass(frozen=True)
class RankTerms:
    """What a training rank holds in every GPU stage beside the stage's own terms."""

    cuda_context: float
    state: Terms  # the mode's state terms (modes.STATE) on the GPU, 0 when offloaded
    kinds: dict[str, str]  # each state term's kind (WEIGHTS, FROZEN, GRADS, OPTIMIZER)
    # The reference policy: a copy in the compute dtype, sharded; with LoRA the same
    # model with the adapter disabled (no copy).
    has_reference: bool
    reference_shard: float  # wherever it lives
    reference: float  # on the GPU (0 when offloaded)
    resident: float  # kept between steps: the state less the gradients
    engine_weights: float  # the rollout engine's bf16 weights (with LoRA's adapter)


def rank_terms(geo: Geometry, st: Settings) -> RankTerms:
    mode = geo.mode(st)
    state = actor_state(geo, st)
    kinds = {t.name: t.kind for t in STATE[mode]}
    has_ref = geo.kl_coef > 0 and mode != LORA
    ref_shard = geo.shape.parameters / geo.world_size * compute_bytes(geo) / GIB
    # vLLM loads the base weights once; with LoRA the adapter rides along (bf16).
    adapter = geo.lora.adapter_parameters if geo.lora is not None else 0
    return RankTerms(
        cuda_context=CUDA_CONTEXT_GIB if geo.is_gpu else 0.0,
        state=state,
        kinds=kinds,
        has_reference=has_ref,
        reference_shard=ref_shard,
        reference=ref_shard if has_ref and not st.offload_params else 0.0,
        # Gradients are freed before generation; weights (trained and frozen) and
        # optimizer state stay on the GPU unless offloaded.
        resident=sum(v for k, v in state.items() if kinds[k] != GRADS),
        engine_weights=(geo.shape.parameters + adapter) * BF16_B / GIB,
    )


def training_stages(geo: Geometry, st: Settings, r: RankTerms) -> dict[str, Terms]:
    """The training GPU's stages of the update: load, training (a decoder layer's
    gather with the largest micro-batch's activations), training_root (the root unit's
    gather) and optimizer_step."""
    s = geo.shape
    adapters = geo.lora.adapter_parameters if geo.lora is not None else None
    buffers = fsdp_buffers(s, compute_bytes(geo), trained(s, adapters))
    # The largest micro-batch in the shared-prefix layout (planner/layout.py): its tokens,
    # padding included, its images (layout.images_per_prompt per row) and its response
    # tokens.
    mb = micro_batch(geo, st)
    act = mb.tokens * activation_bytes_per_token(geo, st.gradient_checkpointing)
    act += mb.images * vision_activation_bytes(geo, st.gradient_checkpointing)
    logits = logprob_bytes(s, compute_bytes(geo), geo.logprob_chunk_tokens, mb.response_tokens,
                           trained_head=trained(s, adapters).head > 0)
    ctx, ref = r.cuda_context, r.reference
    training = {
        "cuda_context": ctx,
        **r.state,
        "reference_model_shard": ref,
        "fsdp_layer_buffers": buffers.layers / GIB,
        "activations": act / GIB,
        "logits": logits / GIB,
        # The shared-prefix layout's attention: the responses' mask and gathers by
        # segment, or the dense [rows, 1, width, width] mask where that is smaller, in the
        # compute dtype, from the collation to the end of backward; widths multiples of 8
        # (layout.py): SDPA's memory-efficient kernel then keeps no padded copy.
        "attention_mask": attention_layout_bytes(geo, mb, compute_bytes(geo)) / GIB,
    }
    # The root unit's all-gather (start of forward) and reduce (end of backward): the
    # same state, FSDP2's root buffers, no activations (planner/fsdp.py).
    training_root = {
        "cuda_context": ctx,
        **r.state,
        "reference_model_shard": ref,
        "fsdp_root_buffers": buffers.root / GIB,
    }
    # Loading: every rank's weight shards (none on the GPU when offloaded), then the
    # reference's beside them, and one whole tensor in flight: rank 0's broadcast
    # (rank-0 init) or a read in the storage dtype (sharded init reads only its own rows;
    # the trainer's fallback for a checkpoint it cannot read that way is rank 0's path).
    # Neither strategy puts the whole model on a GPU.
    loading = {"cuda_context": ctx,
               **{k: v for k, v in r.state.items() if r.kinds[k] in (WEIGHTS, FROZEN)},
               "reference_model_shard": ref,
               "largest_tensor_fp32": s.largest_tensor_parameters * FP32_B / GIB}
    # The optimizer step runs where the parameters live (the trainer's params_home): with
    # only the optimizer offloaded, its state comes back to the GPU for the step beside
    # the weights and gradients (activations and FSDP's buffers are freed by then); with
    # the parameters offloaded the whole step runs in host RAM.
    optimizer_step: Terms = {"cuda_context": ctx}
    if not st.offload_params:
        optimizer_step |= {t.name: _term_gib(geo, t) for t in STATE[geo.mode(st)]}
        optimizer_step["reference_model_shard"] = ref
    return {"load": loading, "training": training, "training_root": training_root,
            "optimizer_step": optimizer_step}


@dataclass(frozen=True)
class RolloutTerms:
    """The rollout's stages on the training GPUs (none apart) and what sizes vLLM."""

    stages: dict[str, Terms]  # rollout and weight_sync, GPU jobs only
    tensor_parallel: int = 1
    kv_cache_gib: float = 0.0
    min_utilization: float = 0.0
    side: RolloutBudget | None = None  # a rollout side of its own (disaggregated)


def rollout_terms(geo: Geometry, st: Settings, r: RankTerms) -> RolloutTerms:
    """By deployment shape: engines apart on CPUs or GPUs (no term on the training
    GPUs), colocated vLLM, or the colocated transformers engine; then the weight sync,
    first in every rollout."""
    weights_gib = r.engine_weights
    ctx, ref = r.cuda_context, r.reference
    stages: dict[str, Terms] = {}
    engine_weights: Terms = {}
    out = RolloutTerms(stages)
    if geo.rollout is not None and not geo.rollout.is_gpu:  # a cpu job's engines apart
        side = cpu_rollout_budget(geo.rollout)
        side = replace(side, **rollout_host(
            geo.rollout, side, cpu_engine_gib(geo, st.rollout_n, geo.rollout.gpus), st))
        out = RolloutTerms(stages, side=side)
    elif geo.rollout is not None:  # vLLM on its own GPUs: no term on the training GPUs
        side = rollout_budget(
            geo.rollout, st.rollout_gpu_memory_utilization, weights_gib,
            kv_bytes_per_token(geo), geo.sequence_length, usable=GPU_USABLE,
            margin_gib=card_margin_gib(geo.rollout.gpu_memory_gib), overhead_gib=VLLM_OVERHEAD_GIB)
        side = replace(side, **rollout_host(geo.rollout, side, weights_gib, st))
        out = RolloutTerms(stages, side.tensor_parallel, side.kv_cache_gib,
                           side.min_utilization, side)
    elif geo.is_gpu and geo.uses_vllm:
        cap = geo.gpu_memory_gib
        tp = rollout_tensor_parallel(geo, st.rollout_gpu_memory_utilization * cap)
        vllm_need = weights_gib / tp + VLLM_OVERHEAD_GIB
        vllm = st.rollout_gpu_memory_utilization * cap
        min_kv = geo.sequence_length * kv_bytes_per_token(geo) / tp / GIB
        stages["rollout"] = {
            "cuda_context": ctx,
            "actor_resident": r.resident,
            "reference_model_shard": ref,
            "vllm_weights": weights_gib / tp,
            "vllm_kv_cache_and_overhead": vllm - weights_gib / tp,
        }
        engine_weights = {"vllm_weights": weights_gib / tp}
        out = RolloutTerms(stages, tp, max(0.0, vllm - vllm_need), (vllm_need + min_kv) / cap)
    elif geo.is_gpu:  # the transformers engine: a whole bf16 copy on every GPU
        stages["rollout"] = {
            "cuda_context": ctx,
            "actor_resident": r.resident,
            "reference_model_shard": ref,
            "generate_engine_bf16": weights_gib,
        }
        engine_weights = {"generate_engine_bf16": weights_gib}
    # The weight sync, first in every rollout: the engine's weights are back, its KV
    # cache still asleep (the trainer wakes it after the sync), and the gather's buffers
    # beside the actor's resident state; in host RAM with offloaded parameters (the
    # shards are there, and so is the gather).
    if geo.is_gpu:
        stages["weight_sync"] = {
            "cuda_context": ctx,
            "actor_resident": r.resident,
            "reference_model_shard": ref,
            **engine_weights,
            "weight_sync_buffers": 0.0 if st.offload_params else weight_sync_bytes(geo) / GIB,
        }
    return out


def host_terms(geo: Geometry, st: Settings, r: RankTerms, training: dict[str, Terms],
               tensor_parallel: int) -> Terms:
    """A worker node's host memory in the steady state (its ranks' share of every term)."""
    s, w = geo.shape, geo.world_size
    ranks = geo.ranks_per_node
    # vLLM sleeps on the training ranks (its copies in host RAM) only when colocated.
    sleeps = geo.is_gpu and geo.uses_vllm and geo.rollout is None
    rank_gib = RANK_PROCESS_GIB if geo.is_gpu else RANK_PROCESS_CPU_GIB
    # Pinned on a GPU node, in blocks torch's host allocator rounds (planner/pinned.py):
    # FSDP2's offloaded shards and gradients, the reference's, the moments the trainer
    # moves off the GPU between steps; moments created in host RAM (offloaded
    # parameters: the step runs there) are plain allocations.
    ref_factor = (_factor(s, None, w, compute_bytes(geo), True) if geo.is_gpu else 1.0)
    host: Terms = {
        "rank_processes": ranks * rank_gib,
        "offloaded_params_and_grads": (
            ranks * (_pinned_gib(geo, st, lambda t: t.params_offload)
                     + (r.reference_shard * ref_factor if r.has_reference else 0.0))
            if st.offload_params
            else 0.0
        ),
        "offloaded_optimizer": (
            ranks * _state_gib(geo, st, lambda t: t.kind == OPTIMIZER) if st.offload_params
            else ranks * _pinned_gib(geo, st, lambda t: t.kind == OPTIMIZER)
            if st.offload_optimizer
            else 0.0
        ),
        # LoRA's vLLM sleeps at level 1 (its base weights wait in host RAM); full fine-tuning
        # at level 2 discards them, since every sync rewrites them (vllm_engine.sleep_level).
        "vllm_sleep_weights": (ranks * r.engine_weights / tensor_parallel
                               if sleeps and geo.lora is not None else 0.0),
        "vllm_sleep_cuda_graphs": ranks * VLLM_CUDA_GRAPHS_GIB if sleeps else 0.0,
        "ray_object_store": st.ray_object_store_gib,
        "weight_sync_buffers": 0.0,
        # Async checkpoint saves stage each rank's trained weights and optimizer state in
        # a host buffer kept across saves (pinned on GPU nodes), whatever is offloaded.
        "async_save_staging": (
            ranks * _pinned_gib(geo, st, lambda t: t.checkpointed) if geo.async_save else 0.0
        ),
    }
    if not geo.is_gpu:  # CPU ranks keep their whole training state in host RAM
        host["cpu_rank_training_state"] = ranks * max(
            sum(v for k, v in part.items() if k != "cuda_context")
            for part in (training["training"], training["training_root"])
        )
        host["cpu_rollout_engine"] = (  # disaggregated: the engines are on their pods
            ranks * cpu_engine_gib(geo, st.rollout_n) if geo.rollout is None else 0.0)
    if st.offload_params or not geo.is_gpu:
        # The sync runs in host RAM, where the shards are, once the update has freed its
        # gradients (on CPU ranks also its activations and buffers), which the terms
        # above count: only what the sync holds beyond them is added.
        if geo.is_gpu:
            freed = _state_gib(geo, st, lambda t: t.kind == GRADS)
        else:
            freed = host["cpu_rank_training_state"] / ranks - r.resident - r.reference
        host["weight_sync_buffers"] = ranks * max(0.0, weight_sync_bytes(geo) / GIB - freed)
    if geo.nodes == 0:  # head runs everything
        host["driver"] = driver_gib(geo)
    return host


def host_load_terms(geo: Geometry, st: Settings, r: RankTerms) -> Terms:
    """Rank 0's node while the model loads. Rank 0 reads the whole checkpoint in float32
    (the trainer's rank-0 init loads `load_full(..., torch.float32)` and shards from that
    copy); x 1.1 for the loader's transient buffers."""
    ranks = geo.ranks_per_node
    load_term = (
        {RANK0_LOAD_TERM: geo.shape.parameters * FP32_B / GIB * LOAD_OVERHEAD}
        if st.rank0_init
        else {"every_rank_full_model_bf16": ranks * r.engine_weights * LOAD_OVERHEAD}
    )
    return {
        "rank_processes": ranks * (RANK_PROCESS_GIB if geo.is_gpu else RANK_PROCESS_CPU_GIB),
        **load_term,
        "ray_object_store": st.ray_object_store_gib,
    }


def compute_budget(geo: Geometry, st: Settings) -> Budget:
    r = rank_terms(geo, st)
    training = training_stages(geo, st, r)
    rollout = rollout_terms(geo, st, r)
    return Budget(
        # A cpu job's ranks hold their training state in host RAM (host_terms).
        gpu_stages={**training, **rollout.stages} if geo.is_gpu else {},
        host_terms=host_terms(geo, st, r, training, rollout.tensor_parallel),
        host_load_terms=host_load_terms(geo, st, r),
        gpu_capacity_gib=geo.gpu_memory_gib * GPU_USABLE if geo.is_gpu else 0.0,
        gpu_margin_gib=gpu_margin_gib(geo),
        host_margin_gib=host_capacity_gib(geo, True) - host_capacity_gib(
            geo, st.pod_memory_at_allocatable),
        host_capacity_gib=host_capacity_gib(geo, st.pod_memory_at_allocatable),
        rollout_tensor_parallel=rollout.tensor_parallel,
        rollout_kv_cache_gib=rollout.kv_cache_gib,
        rollout_min_utilization=rollout.min_utilization,
        rollout_utilization=st.rollout_gpu_memory_utilization if geo.is_gpu else 0.0,
        checkpoint_rank_gib=_state_gib(geo, st, lambda t: t.checkpointed),
        rollout_side=rollout.side,
    )


def rollout_host(side: RolloutSide, rb: RolloutBudget, weights_gib: float,
                 st: Settings) -> dict[str, Any]:
    """A rollout node's host memory: its engines' processes (vLLM's engine core and
    workers, a rank's RSS each), one host copy of the weights while they load (`weights_
    gib`; on cpu each engine's whole state, cpu_engine_gib), and Ray's object store;
    within the pod's share of the node's allocatable, less the headroom unless its
    HostOOM rung raised it to allocatable."""
    allocatable = side.host_memory_gib * (1 - SYSTEM_RESERVED_FRACTION) * side.node_share
    engines = rb.engines_per_node
    return {
        "host_terms": ({"rollout_engine_processes": engines * RANK_PROCESS_GIB,
                        "vllm_weights_load": weights_gib} if side.is_gpu else
                       {"rollout_engine_processes": engines * RANK_PROCESS_CPU_GIB,
                        "cpu_rollout_engine": engines * weights_gib})
        | {"ray_object_store": st.ray_object_store_gib},
        "host_capacity_gib": (allocatable if st.rollout_pod_memory_at_allocatable
                              else allocatable * HOST_HEADROOM),
    }


def max_rollout_utilization(geo: Geometry, st: Settings) -> float:
    """Largest vLLM fraction that leaves room for what the actor keeps resident, and
    the margin; disaggregated, vLLM has the rollout GPU to itself (less the margin)."""
    if geo.rollout is not None:
        cap = geo.rollout.gpu_memory_gib
        return (cap * GPU_USABLE - card_margin_gib(geo.rollout.gpu_memory_gib)) / cap
    b = compute_budget(geo, st)
    rollout = dict(b.gpu_stages.get("rollout", {}))
    others = sum(v for k, v in rollout.items() if not k.startswith("vllm"))
    room = b.gpu_capacity_gib - b.gpu_margin_gib - others
    return room / geo.gpu_memory_gib if geo.is_gpu else 0.0
