"""The rollout side of a disaggregated job (spec.rollout.placement disaggregated): its
nodes and GPUs, and the memory of its GPUs.

A colocated job's GPUs hold the actor and, during rollout, vLLM within the share the
actor leaves (budget.py). Disaggregated, vLLM owns the rollout GPUs: its weights (whole:
an engine apart runs at tensor parallel 1, grpo_api.trainer_config.
ENGINE_APART_TENSOR_PARALLEL says why), its KV cache and its activation profile and CUDA
graphs, all within rollout.gpu_memory_utilization x the rollout GPU; the training GPUs
carry no vLLM term at all, and the rollout nodes' hosts no sleep-mode copies (vLLM never
sleeps there).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from grpo_api.model.units import GIB
from grpo_api.trainer_config import ENGINE_APART_TENSOR_PARALLEL


@dataclass(frozen=True)
class RolloutSide:
    """Where the rollout engines run: the rollout worker group's nodes."""

    gpu: str
    gpu_memory_gib: float
    product_label: str
    nodes: int
    gpus_per_node: int
    node_gpus: int  # GPUs a node of this type has (the catalog's)
    host_memory_gib: float
    cpus_per_node: int
    # spec.rollout.disaggregated.tensorParallelSize (None or 1: the API refuses others).
    tensor_parallel: int | None
    max_staleness: int
    nodes_reason: str = "spec.rollout.disaggregated.nodes"

    @property
    def is_gpu(self) -> bool:  # false: a cpu job's side, its "GPUs" its CPU engines
        return self.node_gpus > 0

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def node_share(self) -> float:
        return min(1.0, self.gpus_per_node / max(1, self.node_gpus))


@dataclass(frozen=True)
class RolloutBudget:
    """One rollout GPU, GiB: what vLLM holds there, against that GPU's memory."""

    gpu: str
    terms: dict[str, float]
    gpu_capacity_gib: float  # usable (GPU_USABLE x the card)
    gpu_margin_gib: float
    tensor_parallel: int
    engines_per_node: int
    utilization: float
    min_utilization: float
    kv_cache_gib: float
    host_terms: dict[str, float] = field(default_factory=dict)  # per rollout node
    host_capacity_gib: float = 0.0  # what a rollout pod may use (0: not checked)

    @property
    def peak_gpu_gib(self) -> float:
        return sum(self.terms.values())

    @property
    def peak_host_gib(self) -> float:
        return sum(self.host_terms.values())

    def problems(self, margin: bool = True) -> list[str]:
        out = []
        left = self.gpu_capacity_gib - self.peak_gpu_gib
        if left < 0 or (margin and left < self.gpu_margin_gib):
            out.append(
                f"rollout GPU ({self.gpu}) peak {self.peak_gpu_gib:.1f} GiB leaves "
                f"{left:.1f} of {self.gpu_capacity_gib:.1f} GiB usable, less than the "
                f"{self.gpu_margin_gib:.1f} GiB margin")
        if self.utilization < self.min_utilization:
            out.append(
                f"vLLM on the rollout side ({self.gpu}) needs rolloutGpuMemoryUtilization >= "
                f"{self.min_utilization:.2f} (weights / TP {self.tensor_parallel} + overhead + "
                f"one max-length sequence of KV cache) but {self.utilization:.2f} is set"
                + (f"; no utilisation fits: an engine apart runs at tensor parallel "
                   f"{self.tensor_parallel}, so choose a rollout gpuType with more memory, "
                   "or placement colocated" if self.min_utilization >= 1 else ""))
        if self.host_capacity_gib and self.peak_host_gib > self.host_capacity_gib:
            out.append(
                f"rollout node host peak {self.peak_host_gib:.1f} GiB > "
                f"{self.host_capacity_gib:.1f} GiB usable")
        return out


def rollout_budget(side: RolloutSide, utilization: float, weights_gib: float,
                   kv_bytes_per_token: float, sequence_length: int, *, usable: float,
                   margin_gib: float, overhead_gib: float) -> RolloutBudget:
    """One rollout GPU's memory: vLLM takes `utilization` x the card (its weights,
    its activation profile and CUDA graphs, `overhead_gib`, and the KV cache in the
    rest: vLLM sizes the cache to fill its share). The minimum utilisation holds one
    max-length sequence of KV cache. stage_terms.compute_budget passes its constants in (this
    module imports nothing of it, so budget.py can import this one). One engine per GPU:
    never a larger tensor parallel, whatever the model (ENGINE_APART_TENSOR_PARALLEL)."""
    cap = side.gpu_memory_gib
    vllm = utilization * cap
    tp = ENGINE_APART_TENSOR_PARALLEL
    need = weights_gib / tp + overhead_gib
    min_kv = sequence_length * kv_bytes_per_token / tp / GIB
    return RolloutBudget(
        gpu=side.gpu,
        terms={"vllm_weights": weights_gib / tp,
               "vllm_activations_and_cuda_graphs": overhead_gib,
               "vllm_kv_cache": max(0.0, vllm - need)},
        gpu_capacity_gib=cap * usable,
        gpu_margin_gib=margin_gib,
        tensor_parallel=tp,
        engines_per_node=side.gpus_per_node // tp,
        utilization=utilization,
        min_utilization=(need + min_kv) / cap,
        kv_cache_gib=max(0.0, vllm - need),
    )


def cpu_rollout_budget(side: RolloutSide) -> RolloutBudget:
    """A cpu job's rollout side: no GPU, so no GPU term; one engine process per "GPU"
    (spec.rollout.disaggregated.gpusPerNode), TP 1. Its host terms are
    stage_terms.rollout_host's."""
    return RolloutBudget(
        gpu=side.gpu, terms={}, gpu_capacity_gib=0.0, gpu_margin_gib=0.0,
        tensor_parallel=ENGINE_APART_TENSOR_PARALLEL,
        engines_per_node=side.gpus_per_node, utilization=0.0, min_utilization=0.0,
        kv_cache_gib=0.0)
