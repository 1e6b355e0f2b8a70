"""Plan dataclasses: the planner's output, consumed by rendering, status and recovery."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from grpo_api.catalog import GPU_RESOURCE
from grpo_api.contract import RANK0_GROUP, RankStage
from grpo_api.knobs import Knob
from grpo_api.model.shape import Shape
from grpo_api.trainer_config import LOGPROB_CHUNK_TOKENS

from .modes import LoraPlan, Mode, mode_of
from .rollout_side import RolloutBudget, RolloutSide


class InfeasibleError(ValueError):
    """The job cannot fit; the message has the numbers and the smallest change that fits."""

    def __init__(self, summary: str, numbers: list[str], suggestions: list[str]) -> None:
        self.summary = summary
        self.numbers = numbers
        self.suggestions = suggestions
        lines = [summary, *(f"  {n}" for n in numbers)]
        if suggestions:
            lines.append("smallest changes that would fit:")
            lines.extend(f"  - {s}" for s in suggestions)
        super().__init__("\n".join(lines))


# The plan's GPU stages each thing the trainer's ranks do runs through (budget.py): the
# headroom's OOM ladder and the planned peaks (peaks.py) read them.
GPU_STAGES: dict[RankStage, tuple[str, ...]] = {
    RankStage.LOAD: ("load",),
    RankStage.ROLLOUT: ("weight_sync", "rollout"),
    RankStage.TRAINING: ("training", "training_root", "optimizer_step"),
}
# The host-load term of rank 0's whole-model read (rank0Init): on rank 0's node only.
RANK0_LOAD_TERM = "rank0_full_model_fp32"


@dataclass(frozen=True)
class Settings:
    """Every memory knob, resolved."""

    rank0_init: bool
    offload_params: bool
    offload_optimizer: bool
    gradient_checkpointing: bool
    micro_batch_size: int
    rollout_gpu_memory_utilization: float
    rollout_n: int
    ray_object_store_gib: float
    pod_memory_at_allocatable: bool = False  # last HostOOM remediation
    # Tokens per micro-batch in the update's layout (rows x the widest, padding
    # included); 0: micro-batches of micro_batch_size samples (a spec that pins it).
    micro_batch_tokens: int = 0
    # spec.training.precision; the CudaOOM ladder may switch mixed to bf16 when
    # spec.recovery.allowPrecisionChange says so.
    precision: str = "mixed"
    # Disaggregated: the rollout pods' memory at their node's allocatable (their HostOOM
    # rung; pod_memory_at_allocatable is the training side's).
    rollout_pod_memory_at_allocatable: bool = False


@dataclass(frozen=True)
class Geometry:
    """Everything fixed for a plan besides the knobs: model, cluster, batch sizes."""

    model_path: str
    shape: Shape
    shape_source: str
    gpu: str
    gpu_memory_gib: float  # 0 for cpu
    nodes: int  # worker pods (0: ranks run in the head pod, cpu only)
    gpus_per_node: int  # GPUs, or CPU ranks for cpu
    node_gpus: int  # GPUs a node of this type has (the catalog's; 0 for cpu)
    host_memory_gib: float  # per node
    cpus_per_node: int
    product_label: str
    sequence_length: int  # prompt + response tokens
    response_length: int
    max_pixels: int
    rollout_batch_size: int
    global_batch_size: int
    kl_coef: float
    rollout_engine: str = "hf"  # "vllm" | "hf", resolved from spec.rollout.engine
    async_save: bool = False  # spec.checkpoint.asyncSave: a host copy of each rank's state
    devices: dict[str, int] = field(default_factory=dict)  # spec.resources.devices, per worker
    fabric: str | None = None  # the catalog's RDMA fabric between nodes of this GPU type
    user_env: frozenset[str] = frozenset()  # env names spec.pods sets (theirs to tune)
    lora: LoraPlan | None = None  # spec.lora, sized on this shape; None: full fine-tuning
    allow_precision_change: bool = False  # spec.recovery.allowPrecisionChange
    # actor.logprob_chunk_tokens: the operator renders none, so the trainer's default.
    logprob_chunk_tokens: int = LOGPROB_CHUNK_TOKENS
    # spec.data.maxImagesPerPrompt: the most images a prompt has (the trainer drops or
    # refuses rows with more when it loads the data).
    max_images_per_prompt: int = 1
    # spec.data.maxVideosPerPrompt (0: no videos), maxFrames and videoMaxPixels: a
    # prompt's videos at most, each of maxFrames frames at videoMaxPixels (layout.py).
    max_videos_per_prompt: int = 0
    max_frames: int = 32
    video_max_pixels: int = 128 * 28 * 28
    # spec.data.rows (None: planner/head.py's default) and spec.data.promptLengths: what the
    # head's index and length pass hold (planner/head.py).
    data_rows: int | None = None
    prompt_lengths: str = "eager"
    # spec.algorithm.rolloutN: the responses a prompt gets, which the driver holds as text
    # for the rewards (planner/head.py); the ladder may lower the knob, never this.
    spec_rollout_n: int = 1
    # spec.rollout.placement disaggregated: the rollout side (None: colocated, every GPU
    # generates and trains).
    rollout: RolloutSide | None = None
    # Where host_memory_gib and cpus_per_node come from (GpuType.node_source, or the spec)
    node_source: str = ""

    @property
    def disaggregated(self) -> bool:
        return self.rollout is not None

    def mode(self, st: Settings) -> Mode:
        """The training mode these settings run: lora, or the precision."""
        return mode_of(st.precision, self.lora)

    @property
    def uses_vllm(self) -> bool:
        return self.rollout_engine == "vllm"

    @property
    def world_size(self) -> int:
        return max(1, self.nodes) * self.gpus_per_node

    @property
    def is_gpu(self) -> bool:
        return self.gpu_memory_gib > 0

    @property
    def ranks_per_node(self) -> int:
        return self.gpus_per_node

    @property
    def node_share(self) -> float:
        """The worker pod's share of its node: its GPUs over the node's (1 for cpu jobs,
        whose ranks are CPU processes). It plans within this share of the node's host
        memory and asks for this share of its CPUs, so jobs that each use part of a
        node's GPUs fit on it side by side."""
        if not self.is_gpu or self.node_gpus < 1:
            return 1.0
        return min(1.0, self.gpus_per_node / self.node_gpus)


@dataclass(frozen=True)
class Budget:
    """Predicted memory, GiB: per GPU by stage, and per worker node on the host."""

    gpu_stages: dict[str, dict[str, float]]
    host_terms: dict[str, float]  # steady state, per worker node
    host_load_terms: dict[str, float]  # while loading weights, on the node of rank 0
    gpu_capacity_gib: float
    host_capacity_gib: float  # what the pod may use (node allocatable x headroom)
    rollout_tensor_parallel: int
    rollout_kv_cache_gib: float
    rollout_min_utilization: float
    rollout_utilization: float = 0.0
    gpu_margin_gib: float = 0.0  # kept free under gpu_capacity_gib (budget.gpu_margin_gib)
    # Below the node's allocatable memory: host_capacity_gib is allocatable minus this.
    host_margin_gib: float = 0.0
    # What one rank writes to a checkpoint (trained weights and optimizer state): the
    # save on SIGTERM that the pods' grace period must cover (planner/save_time.py).
    checkpoint_rank_gib: float = 0.0
    # Disaggregated: one rollout GPU's memory (vLLM's); the rollout_* fields above are
    # then that side's, and gpu_stages the training GPUs' alone.
    rollout_side: RolloutBudget | None = None

    @property
    def peak_gpu_gib(self) -> float:
        return max((sum(t.values()) for t in self.gpu_stages.values()), default=0.0)

    @property
    def engine_weights_gib(self) -> float:
        """The rollout engine's weights on one of its GPUs, as the rollout's terms count
        them: vLLM's TP slice (the rollout side's, or the training GPU's rollout stage's),
        or the transformers engine's whole bf16 copy."""
        terms = (self.rollout_side.terms if self.rollout_side is not None
                 else self.gpu_stages.get("rollout", {}))
        return terms.get("vllm_weights", terms.get("generate_engine_bf16", 0.0))

    @property
    def peak_gpu_stage(self) -> str:
        if not self.gpu_stages:
            return "-"
        return max(self.gpu_stages, key=lambda p: sum(self.gpu_stages[p].values()))

    @property
    def peak_host_gib(self) -> float:
        return max(sum(self.host_terms.values()), sum(self.host_load_terms.values()))

    @property
    def peak_host_other_gib(self) -> float:
        """The host peak of a training node that is not rank 0's: rank 0 alone reads
        the whole model at load (RANK0_LOAD_TERM); a node without it loads nothing more."""
        load = sum(v for k, v in self.host_load_terms.items() if k != RANK0_LOAD_TERM)
        return max(sum(self.host_terms.values()), load)

    @property
    def load_host_peak_gib(self) -> float:
        return sum(self.host_load_terms.values())

    @property
    def gpu_margin_left_gib(self) -> float:
        """Usable GPU memory the peak stage leaves free (the margin it keeps)."""
        return self.gpu_capacity_gib - self.peak_gpu_gib

    @property
    def host_peak_stage(self) -> str:
        """Which host peak is the larger: "while loading" (rank 0's node reads the
        checkpoint) or "steady" (training and rollout): the one a refusal quotes."""
        steady, load = sum(self.host_terms.values()), sum(self.host_load_terms.values())
        return "while loading" if load > steady else "steady"

    @property
    def host_peak_terms(self) -> dict[str, float]:
        """The terms of the larger host peak (host_peak_stage)."""
        return self.host_load_terms if self.host_peak_stage == "while loading" else self.host_terms

    def gpu_problems(self, margin: bool = True) -> list[str]:
        """What does not fit on the training GPUs, or anywhere on a disaggregated job's
        rollout side; with ``margin``, a GPU peak inside the margin too."""
        out = []
        if self.gpu_capacity_gib and self.peak_gpu_gib > self.gpu_capacity_gib:
            out.append(
                f"GPU {self.peak_gpu_stage} peak {self.peak_gpu_gib:.1f} GiB > "
                f"{self.gpu_capacity_gib:.1f} GiB usable per GPU"
            )
        elif margin and self.gpu_capacity_gib and self.gpu_margin_left_gib < self.gpu_margin_gib:
            out.append(
                f"GPU {self.peak_gpu_stage} peak {self.peak_gpu_gib:.1f} GiB leaves "
                f"{self.gpu_margin_left_gib:.1f} of {self.gpu_capacity_gib:.1f} GiB usable per "
                f"GPU, less than the {self.gpu_margin_gib:.1f} GiB margin"
            )
        if self.rollout_side is not None:
            out.extend(self.rollout_side.problems(margin))
        elif (self.rollout_utilization
              and self.rollout_utilization < self.rollout_min_utilization):
            out.append(
                f"vLLM needs rolloutGpuMemoryUtilization >= {self.rollout_min_utilization:.2f} "
                f"(weights / TP {self.rollout_tensor_parallel} + overhead + one max-length "
                f"sequence of KV cache) but {self.rollout_utilization:.2f} is what fits"
            )
        return out

    def host_problems(self) -> list[str]:
        """What does not fit in the training nodes' host memory, naming the peak (steady
        or while loading) it compares."""
        if self.peak_host_gib <= self.host_capacity_gib:
            return []
        return [f"host peak {self.peak_host_gib:.1f} GiB per node ({self.host_peak_stage}) > "
                f"{self.host_capacity_gib:.1f} GiB usable"]

    def problems(self, margin: bool = True) -> list[str]:
        """What does not fit; with ``margin``, a GPU peak inside the margin too."""
        return [*self.gpu_problems(margin), *self.host_problems()]

    @property
    def fits(self) -> bool:
        """Fits with the margin kept: what the planner chooses."""
        return not self.problems()

    @property
    def fits_without_margin(self) -> bool:
        """Fits, but maybe inside the margin: accepted only when pinned knobs leave no
        other choice (core.search)."""
        return not self.problems(margin=False)


@dataclass(frozen=True)
class Decision:
    knob: str
    value: str
    source: str  # "auto" | "spec" | "remediation" | "catalog"
    reason: str


@dataclass(frozen=True)
class PodResources:
    role: str  # a contract.Role
    replicas: int
    gpus: int
    cpus: int
    memory_gib: int
    shm_gib: int
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[dict[str, str], ...] = ()
    devices: dict[str, int] = field(default_factory=dict)  # extended resources, e.g. rdma/ib
    capabilities: tuple[str, ...] = ()  # Linux capabilities the devices need (IPC_LOCK)

    @property
    def extended_resources(self) -> dict[str, str]:
        """GPUs and devices, as the container's requests and limits (equal for these)."""
        gpus = {GPU_RESOURCE: str(self.gpus)} if self.gpus else {}
        return gpus | {name: str(n) for name, n in self.devices.items()}


@dataclass(frozen=True)
class Plan:
    geometry: Geometry
    settings: Settings
    budget: Budget
    pinned: frozenset[str]  # knobs the spec set; remediation leaves them alone
    decisions: tuple[Decision, ...]
    head: PodResources
    worker: PodResources | None
    env: dict[str, str]
    ray_start_params: dict[str, str]  # the workers' (and a head's that runs alone)
    remediations: tuple[str, ...] = ()  # one line per applied rung, with the numbers
    rungs: tuple[str, ...] = ()  # names of the applied rungs (each applies once)
    # Disaggregated: the rollout worker group (vLLM engines); None when colocated.
    rollout: PodResources | None = None
    # Rank 0's worker, apart when it needs more host memory than the others (resources.
    # rank0_apart; RANK0_GROUP): one pod, and `worker` has the other nodes.
    rank0: PodResources | None = None
    rollout_ray_start_params: dict[str, str] = field(default_factory=dict)

    @property
    def world_size(self) -> int:
        return self.geometry.world_size

    def knob_value(self, knob: Knob) -> Any:
        """A planned setting's value: chosen (Settings) or derived (Budget)."""
        return getattr(self.budget if knob.derived else self.settings, knob.setting)

    @property
    def head_ray_start_params(self) -> dict[str, str]:
        """With workers, the head offers Ray no CPU and no GPU: KubeRay would derive its
        --num-cpus from a CPU limit sized for the driver, and rank actors would land
        there; the trainer places its ranks on the workers. A head without workers (cpu,
        nodes 0) runs the ranks itself and keeps the common parameters."""
        if self.worker is None:
            return dict(self.ray_start_params)
        return {**self.ray_start_params, "num-cpus": "0", "num-gpus": "0"}

    @property
    def pods(self) -> int:
        """Ray pods of one attempt: the head and its workers. With more than one, every
        volume they share is mounted from several nodes (the CPU head and the GPU
        workers rarely share one), so `nodes: 1` is already two pods."""
        return sum(p.replicas for p in self.all_pods)

    @property
    def rank0_pod(self) -> PodResources | None:
        """The pod rank 0 runs in: its own (`rank0`), else a worker (None: the head runs
        the ranks). Limits and headroom are compared by it whether or not rank 0 has a
        pod apart, so a rung that joins or splits the groups is judged pod for pod."""
        if self.rank0 is not None:
            return self.rank0
        return None if self.worker is None else replace(self.worker, role=RANK0_GROUP)

    @property
    def all_pods(self) -> tuple[PodResources, ...]:
        """Every kind of Ray pod the attempt has: head, rank 0's, workers, rollout."""
        return tuple(p for p in (self.head, self.rank0, self.worker, self.rollout)
                     if p is not None)
