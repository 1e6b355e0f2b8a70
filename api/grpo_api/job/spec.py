"""GRPOJob.spec: what a researcher writes. The CRD schema is generated from these models
(with `data.py`, `reward.py`, `resources.py` and `recovery.py`: what it trains on, how it
scores, where it runs, how it recovers).

Memory knobs (`resources.MemorySpec`) use "unset = auto": a Kubernetes structural schema
cannot type a field as "boolean or the string auto", and quoting `"true"` in YAML is a
trap, so each knob takes its natural type (boolean / number / integer) and leaving it out
lets the planner decide. The resolved value and the reason for it appear in `status.plan`.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import ConfigDict, Field, JsonValue, model_validator

from ..trainer_config import (
    KLEstimator,
)
from .base import DNS_LABEL_PATTERN, ApiModel, cel_rule
from .data import DataSpec, ModelPath, is_s3
from .hub import HubSpec
from .lora import LoraSpec
from .pods import PodsSpec
from .recovery import (
    CheckpointSpec,
    OpenRestartPolicy,
    RecoverySpec,
    backoff_limit_field,
    restart_policy_field,
)
from .renames import RESTART_NEVER, RenameConflict, with_new_names
from .resources import MemorySpec, ResourcesSpec
from .reward import RewardSpec
from .rollout import RolloutSpec, split_problem
from .tracking import LoggingSpec
from .trainer import TrainerSpec, spec_setting

Precision = Literal["mixed", "bf16"]


class ModelShape(ApiModel):
    """Model size and shape: the override of what the model's config.json says."""

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

    path: ModelPath = Field(
        min_length=1,
        description=(
            "Hub id (e.g. Qwen/Qwen2.5-VL-7B-Instruct), an absolute path to a "
            "directory holding config.json and safetensors (on claimName if set), or an "
            "s3://bucket/prefix/ holding them (fetched with checkpoint.store's settings)."
        ),
    )
    revision: str | None = Field(None, description="Hub revision (branch, tag or commit).")
    claim_name: str | None = Field(
        None,
        pattern=DNS_LABEL_PATTERN,
        description=(
            "Existing PersistentVolumeClaim that holds the model; mounted read-only at "
            "/models in every Ray pod (ReadOnlyMany or ReadWriteMany unless the head "
            "runs alone)."
        ),
    )
    shape: ModelShape | None = Field(
        None,
        description=(
            "Size and shape for the memory planner; overrides config.json. Unset: the "
            "model's config.json, read once per job (status.modelConfig: the hub's for a "
            "hub id, a pod's read of the claim for claimName), else the known-family table "
            "by name."
        ),
    )


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
    kl_estimator: KLEstimator | None = Field(
        None, description="KL estimator of the KL loss (EasyR1 kl_penalty): k1, k3 or "
        "low_var_kl. Unset: low_var_kl. Trainer setting algorithm.kl_estimator.")
    entropy_coef: float | None = spec_setting(
        "algorithm.entropyCoef", "Entropy bonus coefficient in the loss (0: none; above 0 "
        "the plan counts the softmax kept for its gradient).")
    clip_ratio_dual: float | None = spec_setting(
        "algorithm.clipRatioDual", "Dual-clip bound c on the ratio for negative "
        "advantages (DAPO/EasyR1 clip_ratio_dual).")
    norm_adv_by_std: bool | None = Field(
        None, description="Divide each group's advantages by its reward standard deviation "
        "(EasyR1 norm_adv_by_std_in_grpo). Unset: true. Trainer setting "
        "algorithm.norm_adv_by_std.")
    ppo_epochs: int | None = spec_setting(
        "algorithm.ppoEpochs", "Passes of the policy update over each step's responses.")
    offpolicy_is_cap: float | None = spec_setting(
        "algorithm.offpolicyIsCap", "rollout.maxStaleness >= 1 (disaggregated): the cap "
        "of the per-token importance weight pi_proximal / pi_behaviour of an off-policy "
        "sample (truncated importance sampling).")


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
    val_before_train: bool | None = Field(
        None, description="Validate once before the first step of a fresh run (EasyR1 "
        "val_before_train); needs valIntervalSteps. Unset: true. Trainer setting "
        "trainer.val_before_train.")
    warmup_steps: int | None = spec_setting(
        "training.warmupSteps", "Linear learning-rate warm-up, in optimizer steps.")


_SPEC_RULES: list[JsonValue] = [
    cel_rule(
        "!has(self.lora) || !has(self.training) || !has(self.training.precision) "
        "|| self.training.precision != 'bf16'",
        "training.precision bf16 does not combine with lora (LoRA trains fp32 adapters on "
        "a frozen bf16 base); leave precision at mixed",
        ".training.precision",
    ),
    cel_rule(
        "(self.training.rolloutBatchSize * self.algorithm.rolloutN) "
        "% self.training.globalBatchSize == 0",
        "training.globalBatchSize must divide training.rolloutBatchSize x algorithm.rolloutN",
        ".training.globalBatchSize",
    ),
    cel_rule(
        "has(self.checkpoint.store) || (!self.data.train.startsWith('s3://') && "
        "(!has(self.data.val) || !self.data.val.startsWith('s3://')))",
        "s3:// data is fetched with checkpoint.store's endpoint, region and keys: set "
        "checkpoint.store, or give the data as a path or hub id",
        ".data",
    ),
    cel_rule(
        "!self.model.path.startsWith('s3://') || "
        "(has(self.checkpoint.store) && !has(self.model.claimName))",
        "an s3:// model is fetched with checkpoint.store's endpoint, region and keys: set "
        "checkpoint.store, and no model.claimName",
        ".model.path",
    ),
    cel_rule(
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
    "checkpoint.deleteClaimWithJob": (
        "spec.checkpoint.deleteClaimWithJob is deprecated: it is checkpoint.retention: "
        "Delete, which applies to a claimName and to the claim the operator creates alike; "
        "set that instead"
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
    trainer: TrainerSpec = Field(
        default_factory=lambda: TrainerSpec.model_validate({}),
        description="Deprecated: its settings are spec.algorithm's, spec.training's, "
        "spec.reward's and spec.data's now (a value set here moves there; admission warns).",
    )
    logging: LoggingSpec = Field(
        default_factory=lambda: LoggingSpec.model_validate({}),
        description="Where the step metrics go: TensorBoard, Weights & Biases, MLflow; may "
        "change (next attempt).",
    )
    resources: ResourcesSpec = Field(description="GPU type and cluster size.")
    memory: MemorySpec = Field(
        default_factory=lambda: MemorySpec.model_validate({}),
        description="Memory knobs; unset = chosen by the planner.",
    )
    checkpoint: CheckpointSpec = Field(description="Checkpoint volume and retention.")
    restart_policy: OpenRestartPolicy = restart_policy_field()
    backoff_limit: int = backoff_limit_field()
    recovery: RecoverySpec = Field(
        default_factory=lambda: RecoverySpec.model_validate({}),
        description="Restart backoff, stall detection and OOM remediation.",
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
        pattern=DNS_LABEL_PATTERN,
        max_length=63,
        description="Kueue LocalQueue (in the job's namespace) that admits the job: each "
        "attempt's RayCluster carries the label kueue.x-k8s.io/queue-name and waits, "
        "suspended, until Kueue admits it (phase Queued). Unset: the GRPOJob's own "
        "kueue.x-k8s.io/queue-name label, recorded here at creation (as Kueue's jobs take "
        "it); neither: runs at once. Cannot change after creation.",
    )

    @model_validator(mode="before")
    @classmethod
    def _old_names(cls, data: Any) -> Any:
        """Fields written by their old names (renames.py) move to their new ones."""
        if not isinstance(data, dict):
            return data
        try:
            return with_new_names(data)
        except RenameConflict as err:
            raise ValueError(str(err)) from None

    @property
    def max_restarts(self) -> int:
        """Restarts the job may make: backoffLimit, none with restartPolicy Never."""
        return 0 if self.restart_policy == RESTART_NEVER else self.backoff_limit

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
        tokens = self.memory.micro_batch_tokens
        longest = self.data.max_prompt_length + self.data.max_response_length
        if tokens is not None and tokens < longest:
            raise ValueError(f"memory.microBatchTokens: {tokens} cannot hold one whole sample: "
                             f"data.maxPromptLength + maxResponseLength = {longest}")
        problem = split_problem(self.rollout, self.resources)
        if problem:
            raise ValueError(problem)
        if is_s3(self.model.path) and (self.checkpoint.store is None
                                       or self.model.claim_name is not None):
            raise ValueError(
                "model.path: an s3:// model is fetched with checkpoint.store's endpoint, "
                "region and keys: set checkpoint.store, and no model.claimName")
        if (is_s3(self.data.train) or is_s3(self.data.val)) and self.checkpoint.store is None:
            raise ValueError(
                "data: s3:// data is fetched with checkpoint.store's endpoint, region and "
                "keys: set checkpoint.store, or give the data as a path or hub id")
        if self.training.val_interval_steps and self.data.val is None:
            raise ValueError(
                "training.valIntervalSteps: needs data.val (the held-out split to validate "
                "on); set data.val or leave valIntervalSteps at 0"
            )
        return self

    def deprecation_warnings(self) -> list[str]:
        """What admission warns about (kubectl prints it): deprecated fields that are set."""
        set_ = {"data.workers": self.data.workers is not None,
                "checkpoint.deleteClaimWithJob": self.checkpoint.delete_claim_with_job}
        return [DEPRECATED_FIELDS[k] for k, on in set_.items() if on]
