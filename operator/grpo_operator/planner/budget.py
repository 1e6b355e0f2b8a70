"""The memory model: bytes per phase for one (geometry, settings). docs/memory-model.md
derives every formula and names the source of each constant."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from grpo_api.model.kv_cache import engine_kv_cache_bytes
from grpo_api.model.shape import Shape
from grpo_api.model.units import BF16_B, FP32_B, GIB

from .fsdp import fsdp_buffers, trained
from .head import driver_gib
from .layout import micro_batch
from .modes import FROZEN, GRADS, LORA, OPTIMIZER, STATE, WEIGHTS, LoraPlan, StateTerm
from .pinned import adapter_tensors, model_tensors, pinned_factor
from .rollout_side import RolloutBudget, RolloutSide, cpu_rollout_budget, rollout_budget
from .sizes import (
    activation_bytes_per_token,
    compute_bytes,
    kv_bytes_per_token,
    logprob_bytes,
    vision_activation_bytes,
    weight_sync_bytes,
)
from .types import Budget, Geometry, Settings

LOAD_OVERHEAD = 1.1  # a full-model load holds ~10% more than the weights (loader buffers)
CUDA_CONTEXT_GIB = 1.5  # CUDA context + NCCL buffers + cuBLAS workspace per GPU process
GPU_USABLE = 0.95  # leave 5% for fragmentation even with expandable_segments
# Kept free under the usable memory by every plan the planner chooses: NCCL communicators
# beyond the first, cuBLAS/cuBLASLt workspaces per stream, allocator slack and the
# estimated terms' error (docs/memory-model.md, "Margin").
GPU_MARGIN_FRACTION = 0.04
GPU_MARGIN_MIN_GIB = 1.0
# Terms that are estimates, not counts of tensors: `grpo plan` marks them.
ESTIMATES = frozenset({
    "cuda_context", "activations", "vllm_kv_cache_and_overhead",
    "rank_processes", "driver", "rank0_full_model_fp32", "every_rank_full_model_bf16",
    "cpu_rollout_engine", "vllm_sleep_cuda_graphs",
    # A disaggregated job's rollout GPUs and nodes (rollout_side.py, rollout_host).
    "vllm_kv_cache", "vllm_activations_and_cuda_graphs", "rollout_engine_processes",
})
VLLM_OVERHEAD_GIB = 2.0  # vLLM activation profile + CUDA graphs, inside its utilisation
# Of that, the CUDA graph pool (vLLM 0.32 profiles it inside the utilisation:
# VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1, v1/worker/gpu_worker.py:700-710; it logs
# "CUDA graph pool memory: X GiB (actual)"). The trainer sleeps vLLM with
# sleep_mode_offload_cudagraph, which copies the pool to pinned host RAM until the next
# wake-up (vllm_engine.engine_kwargs): a host term per GPU rank while the update runs.
VLLM_CUDA_GRAPHS_GIB = 1.0
RANK_PROCESS_GIB = 3.0  # RSS of one Python rank: torch, CUDA libs, tokenizer, Ray worker
RANK_PROCESS_CPU_GIB = 1.5  # the same without the CUDA libraries (cpu jobs)
SYSTEM_RESERVED_FRACTION = 0.05  # kubelet/system reserve: allocatable ~ 95% of RAM
HOST_HEADROOM = 0.90  # plan within 90% of the pod limit: Ray kills at 95% by default
RAY_MEMORY_USAGE_THRESHOLD = 0.95  # Ray's default; we keep it and stay below it


def gpu_margin_gib(geo: Geometry) -> float:
    """What a plan keeps free under the usable GPU memory (0 for cpu jobs)."""
    return card_margin_gib(geo.gpu_memory_gib) if geo.is_gpu else 0.0


def card_margin_gib(gpu_memory_gib: float) -> float:
    """What one GPU of this memory keeps free under its usable memory (either side's)."""
    return max(GPU_MARGIN_MIN_GIB, GPU_MARGIN_FRACTION * gpu_memory_gib * GPU_USABLE)


def rollout_tensor_parallel(geo: Geometry, vllm_budget_gib: float) -> int:
    """Smallest TP (power of two within a node, dividing KV heads) whose weight slice
    leaves at least 40% of vLLM's budget for KV cache."""
    weights = geo.shape.parameters * BF16_B / GIB
    tp = 1
    while tp < geo.gpus_per_node and (
        weights / tp > 0.6 * vllm_budget_gib
        or geo.shape.kv_heads % tp
        or geo.shape.attention_heads % tp
    ):
        tp *= 2
    return min(tp, max(1, geo.gpus_per_node))


def cpu_engine_gib(geo: Geometry, rollout_n: int, engines: int | None = None) -> float:
    """One CPU rollout engine (float32 on CPU), of `engines` that share the rollout batch
    (default: every rank's own). There is no sleep mode on a CPU, so vLLM keeps its
    weights and KV cache resident; the transformers engine holds a copy of the weights
    and a KV cache that grows with the batch."""
    weights = geo.shape.parameters * FP32_B / GIB
    seqs = max(1, geo.rollout_batch_size // (engines or geo.world_size)) * rollout_n
    per_token = kv_bytes_per_token(geo) * FP32_B / BF16_B
    tokens = seqs * geo.sequence_length
    if geo.uses_vllm:  # TP 1 on CPU: the cache the trainer hands vLLM for these sequences
        return weights + engine_kv_cache_bytes(per_token, tokens) / GIB
    return weights + per_token * tokens / GIB


def host_capacity_gib(geo: Geometry, at_allocatable: bool) -> float:
    """What a pod of the job may use: its share of the node's allocatable memory (all of
    it for a worker with every GPU of its node), less the headroom unless at_allocatable."""
    allocatable = geo.host_memory_gib * (1 - SYSTEM_RESERVED_FRACTION) * geo.node_share
    return allocatable if at_allocatable else allocatable * HOST_HEADROOM


def _term_gib(geo: Geometry, term: StateTerm) -> float:
    """One state term, GiB per rank: a frozen base counts every parameter (in the
    compute dtype, as the trainer stores it), trained state the adapters' (LoRA) or
    every parameter (full fine-tuning), sharded."""
    if term.kind == FROZEN:
        return geo.shape.parameters / geo.world_size * compute_bytes(geo) / GIB
    count = geo.lora.adapter_parameters if geo.lora is not None else geo.shape.parameters
    return count / geo.world_size * term.bytes_per_param / GIB


def offloaded(term: StateTerm, st: Settings) -> bool:
    """Whether the term lives in host RAM. Offloaded parameters take the optimizer
    state with them: the step runs where the parameters are (the trainer's
    ``params_home``), and the state is created there."""
    if term.params_offload:
        return st.offload_params
    return st.offload_optimizer or st.offload_params


def actor_state(geo: Geometry, st: Settings) -> dict[str, float]:
    """GiB per GPU of each of the mode's state terms (modes.STATE), 0 when offloaded."""
    return {
        t.name: 0.0 if offloaded(t, st) else _term_gib(geo, t) for t in STATE[geo.mode(st)]
    }


def _state_gib(geo: Geometry, st: Settings, keep: Callable[[StateTerm], bool]) -> float:
    """The terms `keep` selects, GiB per rank, wherever they live."""
    return sum(_term_gib(geo, t) for t in STATE[geo.mode(st)] if keep(t))


@functools.lru_cache(maxsize=256)
def _factor(shape: Shape, lora: LoraPlan | None, world: int, element_bytes: int,
            frozen: bool) -> float:
    tensors = adapter_tensors(shape, lora) if lora is not None and not frozen else (
        model_tensors(shape))
    return pinned_factor(tensors, world, element_bytes)


def _pinned_gib(geo: Geometry, st: Settings, keep: Callable[[StateTerm], bool]) -> float:
    """The terms `keep` selects, GiB per rank, as pinned host blocks (planner/pinned.py):
    each of their tensors' blocks as torch's host allocator sizes them on a GPU node;
    exact on a CPU node, where nothing is pinned."""
    total = 0.0
    for t in STATE[geo.mode(st)]:
        if keep(t):
            factor = (_factor(geo.shape, geo.lora, geo.world_size, t.element_bytes,
                              t.kind == FROZEN) if geo.is_gpu else 1.0)
            total += _term_gib(geo, t) * factor
    return total


def compute_budget(geo: Geometry, st: Settings) -> Budget:
    s, w = geo.shape, geo.world_size
    p = s.parameters
    mode = geo.mode(st)
    shard = p / w
    state = actor_state(geo, st)
    kinds = {t.name: t.kind for t in STATE[mode]}
    # The reference policy: a copy in the compute dtype, sharded; with LoRA the same
    # model with the adapter disabled (no copy).
    has_ref = geo.kl_coef > 0 and mode != LORA
    ref_shard = shard * compute_bytes(geo) / GIB
    ref = ref_shard if has_ref and not st.offload_params else 0.0
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
    ctx = CUDA_CONTEXT_GIB if geo.is_gpu else 0.0

    training = {
        "cuda_context": ctx,
        **state,
        "reference_model_shard": ref,
        "fsdp_layer_buffers": buffers.layers / GIB,
        "activations": act / GIB,
        "logits": logits / GIB,
        # The shared-prefix layout's 4-D additive mask [rows, 1, width, width], in the
        # compute dtype, from the collation to the end of backward; width a multiple of
        # 8 (layout.py): SDPA's memory-efficient kernel then keeps no padded copy.
        "attention_mask": mb.mask_elements * compute_bytes(geo) / GIB,
    }
    # The root unit's all-gather (start of forward) and reduce (end of backward): the
    # same state, FSDP2's root buffers, no activations (planner/fsdp.py).
    training_root = {
        "cuda_context": ctx,
        **state,
        "reference_model_shard": ref,
        "fsdp_root_buffers": buffers.root / GIB,
    }
    # Gradients are freed before generation; weights (trained and frozen) and optimizer
    # state stay on the GPU unless offloaded.
    resident = sum(v for k, v in state.items() if kinds[k] != GRADS)
    # Loading: every rank's weight shards (none on the GPU when offloaded), then the
    # reference's beside them, and one whole tensor in flight: rank 0's broadcast
    # (rank-0 init) or a read in the storage dtype (sharded init reads only its own rows;
    # the trainer's fallback for a checkpoint it cannot read that way is rank 0's path).
    # Neither strategy puts the whole model on a GPU.
    loading = {"cuda_context": ctx,
               **{k: v for k, v in state.items() if kinds[k] in (WEIGHTS, FROZEN)},
               "reference_model_shard": ref,
               "largest_tensor_fp32": s.largest_tensor_parameters * FP32_B / GIB}
    # The optimizer step runs where the parameters live (the trainer's params_home): with
    # only the optimizer offloaded, its state comes back to the GPU for the step beside
    # the weights and gradients (activations and FSDP's buffers are freed by then); with
    # the parameters offloaded the whole step runs in host RAM.
    optimizer_step: dict[str, float] = {"cuda_context": ctx}
    if not st.offload_params:
        optimizer_step |= {t.name: _term_gib(geo, t) for t in STATE[mode]}
        optimizer_step["reference_model_shard"] = ref
    phases: dict[str, dict[str, float]] = {
        "load": loading, "training": training, "training_root": training_root,
        "optimizer_step": optimizer_step,
    }

    # vLLM loads the base weights once; with LoRA the adapter rides along (bf16).
    adapter = geo.lora.adapter_parameters if geo.lora is not None else 0
    weights_gib = (p + adapter) * BF16_B / GIB
    tp, kv_gib, min_util = 1, 0.0, 0.0
    side: RolloutBudget | None = None
    engine_weights: dict[str, float] = {}
    if geo.rollout is not None and not geo.rollout.is_gpu:  # a cpu job's engines apart
        side = cpu_rollout_budget(geo.rollout)
        side = replace(side, **rollout_host(
            geo.rollout, side, cpu_engine_gib(geo, st.rollout_n, geo.rollout.gpus), st))
    elif geo.rollout is not None:  # vLLM on its own GPUs: no term on the training GPUs
        side = rollout_budget(
            geo.rollout, st.rollout_gpu_memory_utilization, weights_gib,
            kv_bytes_per_token(geo), geo.sequence_length, usable=GPU_USABLE,
            margin_gib=card_margin_gib(geo.rollout.gpu_memory_gib), overhead_gib=VLLM_OVERHEAD_GIB)
        side = replace(side, **rollout_host(geo.rollout, side, weights_gib, st))
        tp, kv_gib, min_util = side.tensor_parallel, side.kv_cache_gib, side.min_utilization
    elif geo.is_gpu and geo.uses_vllm:
        cap = geo.gpu_memory_gib
        tp = rollout_tensor_parallel(geo, st.rollout_gpu_memory_utilization * cap)
        vllm_need = weights_gib / tp + VLLM_OVERHEAD_GIB
        vllm = st.rollout_gpu_memory_utilization * cap
        kv_gib = max(0.0, vllm - vllm_need)
        min_kv = geo.sequence_length * kv_bytes_per_token(geo) / tp / GIB
        min_util = (vllm_need + min_kv) / cap
        phases["rollout"] = {
            "cuda_context": ctx,
            "actor_resident": resident,
            "reference_model_shard": ref,
            "vllm_weights": weights_gib / tp,
            "vllm_kv_cache_and_overhead": vllm - weights_gib / tp,
        }
        engine_weights = {"vllm_weights": weights_gib / tp}
    elif geo.is_gpu:  # the transformers engine: a whole bf16 copy on every GPU
        phases["rollout"] = {
            "cuda_context": ctx,
            "actor_resident": resident,
            "reference_model_shard": ref,
            "generate_engine_bf16": weights_gib,
        }
        engine_weights = {"generate_engine_bf16": weights_gib}
    # The weight sync, first in every rollout: the engine's weights are back, its KV
    # cache still asleep (the trainer wakes it after the sync), and the gather's buffers
    # beside the actor's resident state; in host RAM with offloaded parameters (the
    # shards are there, and so is the gather).
    sync_gib = weight_sync_bytes(geo) / GIB
    if geo.is_gpu:
        phases["weight_sync"] = {
            "cuda_context": ctx,
            "actor_resident": resident,
            "reference_model_shard": ref,
            **engine_weights,
            "weight_sync_buffers": 0.0 if st.offload_params else sync_gib,
        }

    ranks = geo.ranks_per_node
    # vLLM sleeps on the training ranks (its copies in host RAM) only when colocated.
    sleeps = geo.is_gpu and geo.uses_vllm and geo.rollout is None
    checkpoint_rank_gib = _state_gib(geo, st, lambda t: t.checkpointed)
    rank_gib = RANK_PROCESS_GIB if geo.is_gpu else RANK_PROCESS_CPU_GIB
    # Pinned on a GPU node, in blocks torch's host allocator rounds (planner/pinned.py):
    # FSDP2's offloaded shards and gradients, the reference's, the moments the trainer
    # moves off the GPU between steps; moments created in host RAM (offloaded
    # parameters: the step runs there) are plain allocations.
    ref_factor = (_factor(s, None, w, compute_bytes(geo), True) if geo.is_gpu else 1.0)
    host: dict[str, float] = {
        "rank_processes": ranks * rank_gib,
        "offloaded_params_and_grads": (
            ranks * (_pinned_gib(geo, st, lambda t: t.params_offload)
                     + (ref_shard * ref_factor if has_ref else 0.0))
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
        "vllm_sleep_weights": (ranks * weights_gib / tp
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
            for part in (training, training_root)
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
            freed = host["cpu_rank_training_state"] / ranks - resident - ref
        host["weight_sync_buffers"] = ranks * max(0.0, sync_gib - freed)
    if geo.nodes == 0:  # head runs everything
        host["driver"] = driver_gib(geo)
    # Rank 0 reads the whole checkpoint in float32 (the trainer's rank-0 init loads
    # `load_full(..., torch.float32)` and shards from that copy); x 1.1 for the loader's
    # transient buffers.
    load_term = (
        {"rank0_full_model_fp32": p * FP32_B / GIB * LOAD_OVERHEAD}
        if st.rank0_init
        else {"every_rank_full_model_bf16": ranks * weights_gib * LOAD_OVERHEAD}
    )
    host_load = {
        "rank_processes": ranks * rank_gib,
        **load_term,
        "ray_object_store": st.ray_object_store_gib,
    }
    gpu_cap = geo.gpu_memory_gib * GPU_USABLE if geo.is_gpu else 0.0
    if not geo.is_gpu:
        phases = {}
    return Budget(
        gpu_phases=phases,
        host_terms=host,
        host_load_terms=host_load,
        gpu_capacity_gib=gpu_cap,
        gpu_margin_gib=gpu_margin_gib(geo),
        host_margin_gib=host_capacity_gib(geo, True) - host_capacity_gib(
            geo, st.pod_memory_at_allocatable),
        host_capacity_gib=host_capacity_gib(geo, st.pod_memory_at_allocatable),
        rollout_tensor_parallel=tp,
        rollout_kv_cache_gib=kv_gib,
        rollout_min_utilization=min_util,
        rollout_utilization=st.rollout_gpu_memory_utilization if geo.is_gpu else 0.0,
        checkpoint_rank_gib=checkpoint_rank_gib,
        rollout_side=side,
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
    rollout = dict(b.gpu_phases.get("rollout", {}))
    others = sum(v for k, v in rollout.items() if not k.startswith("vllm"))
    room = b.gpu_capacity_gib - b.gpu_margin_gib - others
    return room / geo.gpu_memory_gib if geo.is_gpu else 0.0
