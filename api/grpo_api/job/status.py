"""GRPOJob.status: written by the operator (and `progress` by the trainer driver)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ..contract import ConditionType, Phase, RankStage
from ..trainer_config import RolloutPlacement
from .base import ApiModel
from .memory_peaks import MeasuredPeaks, MemoryPeaks

AttemptOutcome = Literal[
    "Running",
    "Succeeded",
    "HostOOM",
    "CudaOOM",
    "RayOOM",
    "NodeLost",
    "WorkersMissing",
    "Evicted",
    "Preempted",
    "Hang",
    "Terminated",
    "ConfigError",
    "CheckpointIncompatible",
    "Error",
]
# metav1.Condition.reason: CamelCase, machine-readable.
_REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
Fabric = Annotated[str, Field(description="A fabric: infiniband or efa.")]
NcclTransport = Annotated[str, Field(max_length=64, description="An NCCL transport.")]
NcclLine = Annotated[str, Field(max_length=512, description="An NCCL log line's text.")]


class Condition(ApiModel):
    """A Kubernetes-style condition (metav1.Condition)."""

    # Not strict: the wire (and code) spell the enum as its string.
    type: ConditionType = Field(strict=False, description="Condition type.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(
        min_length=1, max_length=1024, pattern=_REASON_PATTERN, description="CamelCase cause."
    )
    message: str = Field("", max_length=32768, description="Human-readable detail.")
    last_transition_time: str = Field(
        json_schema_extra={"format": "date-time"},
        description="When status last changed (RFC 3339).",
    )
    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation this condition was computed for."
    )


class RolloutPlanStatus(ApiModel):
    """A disaggregated job's rollout side as planned: its nodes and one GPU's memory."""

    gpu: str = Field(description="GPU type of the rollout nodes.")
    nodes: int = Field(ge=1, description="Rollout worker pods.")
    gpus_per_node: int = Field(ge=1, description="GPUs per rollout worker.")
    tensor_parallel_size: int = Field(ge=1, description="GPUs of one vLLM engine.")
    engines_per_node: int = Field(ge=1, description="vLLM engines per rollout worker.")
    gpu_memory_utilization: float = Field(
        ge=0, le=1,
        description="vLLM's share of a rollout GPU (memory.rolloutGpuMemoryUtilization).")
    kv_cache_gib: float = Field(ge=0, alias="kvCacheGiB", description="KV cache per GPU, GiB.")
    peak_gpu_gib: float = Field(
        ge=0, alias="peakGpuGiB", description="Predicted peak memory of a rollout GPU, GiB.")
    max_staleness: int = Field(ge=0, description="spec.rollout.maxStaleness in effect.")


class PlanStatus(ApiModel):
    """The resolved plan for the current attempt; `details` holds every reason."""

    gpu: str = Field(description="GPU type.")
    nodes: int = Field(ge=0, description="Worker pods.")
    gpus_per_node: int = Field(ge=0, description="GPUs (or CPU ranks) per worker.")
    total_gpus: int = Field(ge=0, description="World size (GPUs, or CPU ranks for cpu).")
    rank0_init: bool = Field(description="Resolved memory.rank0Init.")
    offload_params: bool = Field(description="Resolved memory.offloadParams.")
    offload_optimizer: bool = Field(description="Resolved memory.offloadOptimizer.")
    gradient_checkpointing: bool = Field(description="Resolved memory.gradientCheckpointing.")
    micro_batch_size: int = Field(
        ge=1, description="Resolved memory.microBatchSize (used when microBatchTokens is 0).")
    micro_batch_tokens: int = Field(
        0, ge=0, description="Resolved memory.microBatchTokens: tokens per micro-batch of the "
        "update, padding included; 0: micro-batches of microBatchSize samples.")
    rollout_gpu_memory_utilization: float = Field(
        ge=0, le=1, description="Resolved memory.rolloutGpuMemoryUtilization."
    )
    rollout_n: int = Field(ge=1, description="Generations per prompt in effect.")
    precision: Literal["mixed", "bf16"] = Field(
        "mixed",
        description=(
            "Precision in effect: training.precision, or bf16 after a remediation that "
            "recovery.allowPrecisionChange allowed."
        ),
    )
    mode: Literal["mixed", "bf16", "lora"] = Field(
        "mixed",
        description=(
            "Training mode the plan budgets: mixed (fp32 master state), bf16 (bf16 state, "
            "Kahan-compensated AdamW) or lora (frozen bf16 base + fp32 adapters)."
        ),
    )
    rollout_engine: str = Field(
        "hf", description="Rollout engine in effect (vllm or hf), from spec.rollout.engine."
    )
    rollout_tensor_parallel: int = Field(
        1, ge=1, description="Ranks that share one vLLM engine (tensor parallel), planned."
    )
    placement: RolloutPlacement = Field(
        "colocated", description="spec.rollout.placement: colocated (every GPU generates and "
        "trains) or disaggregated (rollout holds the rollout side; the fields above are the "
        "training side's).")
    rollout: RolloutPlanStatus | None = Field(
        None, description="The rollout side of a disaggregated job.")
    fabrics: list[Fabric] = Field(
        default_factory=list,
        description="RDMA fabrics whose devices the workers request (infiniband, efa): what "
        "NCCL should use between nodes (progress.transport says what it did).",
    )
    model_source: str = Field(
        "", description="Where the model's shape came from: spec.model.shape, hub config.json, "
        "claim config.json, or the known table (and why no config.json was read)."
    )
    peak_gpu_gib: float = Field(
        ge=0, alias="peakGpuGiB", description="Predicted peak GPU memory per GPU, GiB."
    )
    peak_host_gib: float = Field(
        ge=0, alias="peakHostGiB", description="Predicted peak host memory per node, GiB."
    )
    peaks: MemoryPeaks | None = Field(
        None, description="The planned peaks the trainer's measured ones are compared with "
        "(progress.measuredPeaks; the MemoryPlan condition).")
    predicted_save_seconds: float = Field(
        0.0, ge=0, description="Predicted seconds of one checkpoint save (a node's ranks' "
        "shards at a conservative write rate).",
    )
    node_source: str = Field(
        "", description="Where the node RAM and CPUs the pods are sized for come from: the "
        "Nodes the operator read (the smallest of those labelled with the GPU type's "
        "product), spec.resources.hostMemory / cpusPerNode, or the catalog's figures, "
        "named as assumed.")
    inherited: dict[str, str] | None = Field(
        None, description="The spec fields the platform's defaults set (the chart's "
        "jobDefaults), field -> where from: jobDefaults or jobDefaults.namespaces.<name>. "
        "Every other field is the job's own or the planner's (details.decisions).")
    termination_grace_seconds: int = Field(
        30, ge=0,
        description=(
            "terminationGracePeriodSeconds of the Ray pods: the save on SIGTERM (measured "
            "progress.saveSeconds once a save happened, else predicted) x 1.5 + 30 s, "
            "within 60..3600 s."
        ),
    )
    details: dict[str, Any] = Field(
        default_factory=dict,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        description="Free-form planner output: per-phase budgets and one reason per choice.",
    )


class ModelConfigStatus(ApiModel):
    """The model's config.json as the operator read it once for the job (the plan of
    every attempt uses it), or why the known table stands in."""

    source: Literal["hub", "claim", "store", "table"] = Field(
        description="hub: the hub's config.json; claim: read by a pod on spec.model.claimName; "
        "store: read by a pod from the s3:// model (checkpoint.store's keys); "
        "table: none could be read, the known-family table sized the model."
    )
    location: str = Field(description="The URL, or claim:path, that was read.")
    architecture: str | None = Field(None, description="config.json's model_type.")
    config: dict[str, Any] | None = Field(
        None,
        json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        description="The fields of config.json that size the model.",
    )
    message: str | None = Field(
        None, max_length=4096, description="Why the table stands in (the read's error)."
    )
    read_at: str = Field(
        json_schema_extra={"format": "date-time"}, description="When it was read."
    )


class FetchProgress(ApiModel):
    """Fetching hub repos onto the job's volume; shown as the HubFetch condition."""

    repo: str = Field(description="The repo being fetched (owner/name).")
    file: str = Field("", description="The file being fetched, if any.")
    bytes_done: int = Field(0, ge=0, description="Bytes of the repo on the volume.")
    bytes_total: int = Field(0, ge=0, description="Bytes of the repo.")
    state: Literal["Fetching", "Fetched", "Failed"] = Field(description="Where it stands.")
    message: str | None = Field(None, max_length=1024, description="Why it failed.")


class CheckpointUploadProgress(ApiModel):
    """The newest checkpoint's upload to spec.checkpoint.store, as the driver last saw its
    ranks' uploads; shown as the CheckpointUpload condition."""

    state: Literal["Uploading", "Retrying", "Uploaded"] = Field(
        description="Uploading: files still going up; Retrying: the store failed some and "
        "they are retried with backoff (training goes on); Uploaded: the checkpoint is "
        "complete in the store.")
    step: int = Field(ge=0, description="The checkpoint's step.")
    tries: int = Field(0, ge=0, description="Upload requests so far, retries included.")
    waited_seconds: float = Field(0.0, ge=0, description="Since its upload began.")
    message: str | None = Field(
        None, max_length=1024, description="The store's last error (never the keys).")


class TransportStatus(ApiModel):
    """The transport NCCL chose, from its INIT/NET log lines on the first attempt's ranks
    (grpo_trainer.cluster.nccl_log); the operator shows a fabric job that got sockets as the
    FabricFallback condition."""

    network: str | None = Field(
        None, max_length=64,
        description="NCCL's network between nodes: IB, EFA, Socket (or OFI/<provider>); "
        "null when no NCCL line named one.",
    )
    intra_node: list[NcclTransport] = Field(
        default_factory=list,
        description="Transports NCCL used inside a node: NVLS, P2P/CUMEM, P2P/IPC, SHM.",
    )
    inter_node: bool = Field(
        False, description="A channel crossed nodes (false: every peer was on its node)."
    )
    causes: list[NcclLine] = Field(
        default_factory=list,
        description="NCCL's words for a network it did not take (NET/IB : No device found.).",
    )
    attempt: int = Field(0, ge=0, description="The attempt whose ranks reported it.")


class ProgressStatus(ApiModel):
    """Training progress, patched by the trainer driver at most every 10 s."""

    step: int = Field(0, ge=0, description="Last finished step.")
    total_steps: int | None = Field(None, ge=0, description="Steps the job will run.")
    reward_mean: float | None = Field(None, description="Mean reward of the last step.")
    last_checkpoint_step: int | None = Field(
        None, ge=0, description="Step of the newest complete checkpoint."
    )
    updated_at: str | None = Field(
        None, json_schema_extra={"format": "date-time"}, description="Time of this update."
    )
    memory_growth: str | None = Field(
        None,
        max_length=1024,
        description="Set while the trainer's leak detector sees sustained memory growth.",
    )
    val_reward_mean: float | None = Field(
        None,
        description="Mean reward on data.val at valStep (greedy, one response per prompt).",
    )
    val_step: int | None = Field(
        None, ge=0, description="Step of the newest validation pass (0: before training)."
    )
    save_seconds: float | None = Field(
        None, ge=0,
        description=(
            "Measured time of this attempt's newest checkpoint save, from its start to its "
            "commit (what a save on SIGTERM needs within the pods' grace period)."
        ),
    )
    bad_rows: int | None = Field(
        None, ge=0,
        description=(
            "Rows of the data left out as unreadable (spec.data.badRows: skip): a missing "
            "or corrupt image or video, an empty prompt, no answer; the trainer's log names "
            "each."
        ),
    )
    stage: str | None = Field(
        None, max_length=256,
        description="The stage of a step the driver entered last (rollout, update, "
        "checkpoint...).",
    )
    stage_at: str | None = Field(
        None, json_schema_extra={"format": "date-time"},
        description=(
            "When it entered it: with updatedAt, the driver's last sign of life, which the "
            "operator's progress deadline watches."
        ),
    )
    # Trainer images before the rename write these: in the CRD (validation schema) so the
    # API server does not prune them, read as stage/stageAt (_read_old_stage), and never
    # written back (exclude: not even as null, which a status list item may not hold).
    old_phase: str | None = Field(
        None, alias="phase", max_length=256, exclude=True,
        description="Deprecated: the old name of stage, written by older trainer images "
        "(read as stage).",
    )
    old_phase_at: str | None = Field(
        None, alias="phaseAt", json_schema_extra={"format": "date-time"}, exclude=True,
        description="Deprecated: the old name of stageAt (read as stageAt).",
    )
    fetch: FetchProgress | None = Field(
        None, description="The head's hub fetch (grpo_trainer.hub_fetch), while and after."
    )
    transport: TransportStatus | None = Field(
        None, description="The transport NCCL chose, as the first attempt's ranks logged it."
    )
    measured_peaks: MeasuredPeaks | None = Field(
        None, description="The highest memory readings of the attempt's ranks so far, beside "
        "plan.peaks (the MemoryPlan condition)."
    )
    checkpoint_upload: CheckpointUploadProgress | None = Field(
        None, description="With spec.checkpoint.store: the newest checkpoint's upload (the "
        "CheckpointUpload condition)."
    )

    @model_validator(mode="after")
    def _read_old_stage(self) -> ProgressStatus:
        """An older trainer's phase/phaseAt read as stage/stageAt (the newer mark wins
        where both are there: ISO times in one format order as strings)."""
        if self.old_phase is not None and (
                self.stage is None or (self.old_phase_at or "") > (self.stage_at or "")):
            self.stage, self.stage_at = self.old_phase, self.old_phase_at
        return self


class AttemptRecord(ApiModel):
    """One run of the Ray cluster, from start to its outcome."""

    index: int = Field(ge=0, description="Attempt number, 0 first.")
    start_time: str | None = Field(
        None, json_schema_extra={"format": "date-time"}, description="When it started."
    )
    end_time: str | None = Field(
        None, json_schema_extra={"format": "date-time"}, description="When it ended."
    )
    outcome: AttemptOutcome = Field("Running", description="Failure class or Succeeded.")
    reason: str | None = Field(None, max_length=4096, description="What happened, in words.")
    step: int | None = Field(None, ge=0, description="Step reached.")
    resumed_from_step: int | None = Field(
        None, ge=0, description="Checkpoint step this attempt resumed from."
    )
    last_checkpoint_step: int | None = Field(
        None, ge=0, description="Newest complete checkpoint when it ended."
    )
    remediation: str | None = Field(
        None, max_length=1024, description="Safer setting applied for the next attempt."
    )
    failed_stage: RankStage | None = Field(
        None, description="What the trainer's ranks were doing when it failed (load, "
        "rollout, training, kv_cache): the memory ladder relieves that stage first."
    )
    old_failed_phase: RankStage | None = Field(
        None, alias="failedPhase", exclude=True,
        description="Deprecated: the old name of failedStage, in attempts recorded by older "
        "operators (read as failedStage)."
    )
    failed_side: Literal["rollout"] | None = Field(
        None, description="rollout: the failure was on a disaggregated job's rollout side "
        "(a rollout pod, or its vLLM engines): the memory ladder acts on that side only."
    )
    logs: str | None = Field(
        None, description="Where each of the attempt's Ray pods keeps its output, "
        "`<claim>:<path in the claim>` (a `<pod name>.log` per pod; the driver's holds its "
        "ranks' lines), and its Kubernetes events (`events.log`): they outlive the pods.")
    node: str | None = Field(
        None, max_length=253, description="The Kubernetes node whose loss ended it (a "
        "node-class failure: NodeLost, Evicted): the next attempt's pods avoid that node."
    )

    @model_validator(mode="after")
    def _read_old_failed_stage(self) -> AttemptRecord:
        """An attempt recorded as failedPhase (older operators) read as failedStage."""
        if self.old_failed_phase is not None and self.failed_stage is None:
            self.failed_stage = self.old_failed_phase
        return self


class NextAttempt(ApiModel):
    """A restart waiting for its backoff (written by the operator)."""

    index: int = Field(ge=0, description="Index of the attempt that will start.")
    not_before: str = Field(
        json_schema_extra={"format": "date-time"},
        description="The attempt starts at or after this time (exponential, capped backoff).",
    )


class RayClusterStatus(ApiModel):
    """The KubeRay RayCluster running the current attempt."""

    name: str = Field(description="RayCluster name.")
    state: str | None = Field(None, description="RayCluster .status.state as KubeRay reports it.")
    admitted_generation: int | None = Field(
        None,
        ge=0,
        description="Set once Kueue admitted it (spec.queueName): its metadata.generation "
        "then; suspended at a later generation = preempted.",
    )


class ExportStatus(ApiModel):
    """Where the finished job's model is: written by the operator from the trainer's
    termination message when the job succeeds."""

    claim_name: str | None = Field(None, description="The checkpoint claim that holds it.")
    path: str | None = Field(
        None,
        min_length=1,
        description="Directory in that claim (e.g. <namespace>/<job>/export): Hugging Face "
        "safetensors, config and processor files; from_pretrained loads it.",
    )
    uri: str | None = Field(
        None, min_length=1,
        description="With spec.checkpoint.store: where in the store it is (s3://...; the "
        "same files, its marker export.json uploaded last).",
    )
    step: int = Field(ge=0, description="The training step it was exported from.")


class GRPOJobStatus(ApiModel):
    """Observed state, following the Kubernetes API conventions."""

    observed_generation: int | None = Field(
        None, ge=0, description="metadata.generation the status reflects."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        json_schema_extra={
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
        description="Ready, Progressing, Degraded, Suspended, Succeeded, Failed, Queued (the "
        "operator's); "
        "MemoryGrowth, HubFetch (from the trainer's reports).",
    )
    phase: Phase | None = Field(None, strict=False, description="One-word summary for humans.")
    plan: PlanStatus | None = Field(None, description="Resolved plan of the current attempt.")
    # Not `model_config`: pydantic reserves that name.
    read_model_config: ModelConfigStatus | None = Field(
        None, alias="modelConfig",
        description="The model's config.json, read once for the job (hub or claim).")
    progress: ProgressStatus | None = Field(None, description="Training progress.")
    attempt: int | None = Field(None, ge=0, description="Index of the current attempt.")
    restarts: int = Field(0, ge=0, description="Restarts so far.")
    preemptions: int = Field(
        0, ge=0, description="Attempts Kueue preempted (they cost no restart budget)."
    )
    attempts: list[AttemptRecord] = Field(
        default_factory=list, description="Every attempt, oldest first."
    )
    ray_cluster: RayClusterStatus | None = Field(None, description="Current RayCluster.")
    next_attempt: NextAttempt | None = Field(
        None, description="Set while a restart waits for its backoff; removed when it starts."
    )
    export: ExportStatus | None = Field(
        None, description="The final model, exported when the job succeeded."
    )
