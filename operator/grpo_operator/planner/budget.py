"""The memory model's constants and per-term formulas (the state terms, margins, capacities):
stage_terms.py builds each stage's terms from them. docs/memory-model.md derives every formula
and names the source of each constant."""

from __future__ import annotations

import functools
from collections.abc import Callable

from grpo_api.model.kv_cache import engine_kv_cache_bytes
from grpo_api.model.shape import Shape
from grpo_api.model.units import BF16_B, FP32_B, GIB

from .modes import FROZEN, STATE, LoraPlan, StateTerm
from .pinned import adapter_tensors, model_tensors, pinned_factor
from .sizes import (
    compute_bytes,
    kv_bytes_per_token,
)
from .types import Geometry, Settings

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
