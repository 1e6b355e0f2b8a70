"""spec.trainer: the trainer's algorithm settings a GRPOJob passes on as they are.

These are the EasyR1-style settings that no planner decision depends on. Each field is
one trainer config path (TRAINER_PATHS); its type and bounds are the trainer schema's own
(grpo_api.trainer_config), so the API server, the webhook and the trainer refuse the same
values, and the operator validates the whole rendered config with that schema at apply.

What the operator plans or renders from other spec fields (memory knobs, batch sizes,
lengths, the learning rate, ...) is no field here: the CRD keeps spec.trainer open so that
such a setting reaches the webhook, which refuses it naming the spec field that sets it
(`unknown_field_hint`, from SPEC_SOURCES and grpo_api.knobs).
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator
from pydantic.alias_generators import to_camel

from ..knobs import KNOBS
from ..trainer_config import BUILTIN_FORMAT_PROMPTS, Config, KLEstimator
from .base import ApiModel

# spec.trainer's fields (snake_case) -> the trainer config path each one sets.
TRAINER_PATHS = {
    "format_prompt": "data.format_prompt",
    "entropy_coef": "algorithm.entropy_coef",
    "clip_ratio_dual": "algorithm.clip_ratio_dual",
    "kl_estimator": "algorithm.kl_estimator",
    "norm_adv_by_std": "algorithm.norm_adv_by_std",
    "warmup_steps": "actor.warmup_steps",
    "ppo_epochs": "actor.ppo_epochs",
    "reward_timeout_seconds": "reward.timeout_s",
    "reward_workers": "reward.num_workers",
    "val_before_train": "trainer.val_before_train",
}

# Trainer config paths the operator renders from another spec field (the planned knobs'
# own are in grpo_api.knobs): admission names these fields when the trainer's schema
# refuses a config, and spec.trainer refuses them naming the field to set instead.
# tests/unit/test_trainer_settings.py checks that every path the operator renders is here.
SPEC_SOURCES = {
    "model.path": "spec.model.path",
    "data.train_files": "spec.data.train",
    "data.val_files": "spec.data.val",
    "data.prompt_key": "spec.data.promptKey",
    "data.answer_key": "spec.data.answerKey",
    "data.image_key": "spec.data.imageKey",
    "data.max_prompt_length": "spec.data.maxPromptLength",
    "data.seed": "spec.training.seed",
    "data.image_max_pixels": "spec.data.maxPixels",
    "data.image_min_pixels": "spec.data.maxPixels",
    "data.overlong_prompts": "spec.data.overlongPrompts",
    "rollout.engine": "spec.rollout.engine",
    "rollout.temperature": "spec.algorithm.temperature",
    "rollout.top_p": "spec.algorithm.topP",
    "rollout.max_new_tokens": "spec.data.maxResponseLength",
    "rollout.seed": "spec.training.seed",
    "rollout.tensor_parallel_size": "spec.rollout",
    "algorithm.clip_ratio_low": "spec.algorithm.clipRatioLow",
    "algorithm.clip_ratio_high": "spec.algorithm.clipRatioHigh",
    "algorithm.kl_coef": "spec.algorithm.klCoef",
    "actor.lr": "spec.training.learningRate",
    "actor.weight_decay": "spec.training.weightDecay",
    "actor.max_grad_norm": "spec.training.maxGradNorm",
    "actor.mini_batch_size": "spec.training.globalBatchSize",
    "actor.dtype": "spec.resources.gpu",
    "actor.lora": "spec.lora",
    "resources.num_workers": "spec.resources.nodes x spec.resources.gpusPerNode",
    "resources.nodes": "spec.resources.nodes",
    "resources.ranks_per_node": "spec.resources.gpusPerNode",
    "resources.ranks_on_head": "spec.resources.nodes",
    "resources.gpus_per_worker": "spec.resources.gpu",
    "resources.cpus_per_worker": "spec.resources.cpusPerNode",
    "resources.ray_address": "spec.resources",
    "reward.type": "spec.reward.type",
    "reward.function": "spec.reward.function",
    "reward.format_weight": "spec.reward.formatWeight",
    "checkpoint.dir": "spec.checkpoint",
    "checkpoint.interval_steps": "spec.checkpoint.intervalSteps",
    "checkpoint.keep": "spec.checkpoint.keep",
    "checkpoint.async_save": "spec.checkpoint.asyncSave",
    "checkpoint.export": "the operator (every job exports its final model: status.export)",
    "metrics.prometheus_port": "spec.logging",
    "metrics.progress_bar": "spec.logging",
    "metrics.tensorboard_dir": "spec.logging.tensorboard",
    "metrics.wandb": "spec.logging.wandb",
    "metrics.mlflow": "spec.logging.mlflow",
    "trainer.total_steps": "spec.training.maxSteps",
    "trainer.epochs": "spec.training.epochs",
    "trainer.rollout_batch_size": "spec.training.rolloutBatchSize",
    "trainer.seed": "spec.training.seed",
    "trainer.val_interval_steps": "spec.training.valIntervalSteps",
    "trainer.job_name": "metadata.name",
    "trainer.job_namespace": "metadata.namespace",
    "trainer.attempt": "the operator's attempt count",
    "trainer.stall_timeout_s": "spec.restartPolicy.stallTimeoutSeconds",
} | {path: f"spec.trainer.{to_camel(name)}" for name, path in TRAINER_PATHS.items()}


def config_sources() -> dict[str, str]:
    """Every trainer config path the operator renders -> the spec field that sets it."""
    return {k.trainer: k.spec_path for k in KNOBS if k.trainer} | SPEC_SOURCES


def _schema_field(path: str, description: str) -> Any:
    """A spec.trainer field with the trainer schema's bounds for `path` and its default
    named in the description (unset: the trainer's default)."""
    section, key = path.split(".")
    model = Config.model_fields[section].annotation
    assert isinstance(model, type), path
    info = model.model_fields[key]
    bounds = {b: getattr(m, b) for m in info.metadata for b in ("ge", "gt", "le", "lt")
              if getattr(m, b, None) is not None}
    return Field(None, description=f"{description} Unset: {info.default}. Trainer "
                 f"setting {path}.", **bounds)


class TrainerSpec(ApiModel):
    """EasyR1-style trainer settings the operator passes on as they are (the planned ones
    are set elsewhere in the spec: setting one here is refused, naming where)."""

    # Open in the CRD: a setting that is not a field here (a planned one) reaches the
    # webhook, which names the spec field to use instead of the API server's bare
    # "unknown field".
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})

    format_prompt: str | None = Field(
        None, min_length=1,
        description="The prompt template: plain, math or r1v (builtin), or the absolute path "
        "of a Jinja2 file in the pods (e.g. from a ConfigMap in spec.pods.*.volumes) that "
        "renders {{ content }}, the row's prompt. Unset: math for reward.type math, r1v for "
        "r1v, plain for function. Trainer setting data.format_prompt.")
    entropy_coef: float | None = _schema_field(
        "algorithm.entropy_coef", "Entropy bonus coefficient in the loss (0: none; "
        "above 0 the plan counts the softmax kept for its gradient).")
    clip_ratio_dual: float | None = _schema_field(
        "algorithm.clip_ratio_dual", "Dual-clip bound c on the ratio for negative "
        "advantages (DAPO/EasyR1 clip_ratio_dual).")
    kl_estimator: KLEstimator | None = Field(
        None, description="KL estimator of the KL loss (EasyR1 kl_penalty): k1, k3 or "
        "low_var_kl. Unset: low_var_kl. Trainer setting algorithm.kl_estimator.")
    norm_adv_by_std: bool | None = Field(
        None, description="Divide each group's advantages by its reward standard deviation "
        "(EasyR1 norm_adv_by_std_in_grpo). Unset: true. Trainer setting "
        "algorithm.norm_adv_by_std.")
    warmup_steps: int | None = _schema_field(
        "actor.warmup_steps", "Linear learning-rate warm-up, in optimizer steps.")
    ppo_epochs: int | None = _schema_field(
        "actor.ppo_epochs", "Passes of the policy update over each step's responses.")
    reward_timeout_seconds: float | None = _schema_field(
        "reward.timeout_s", "Seconds one reward call may take; a slower one scores 0.")
    reward_workers: int | None = _schema_field(
        "reward.num_workers", "Reward calls scored at once (threads of the driver).")
    val_before_train: bool | None = Field(
        None, description="Validate once before the first step of a fresh run (EasyR1 "
        "val_before_train); needs training.valIntervalSteps. Unset: true. Trainer setting "
        "trainer.val_before_train.")

    @field_validator("format_prompt")
    @classmethod
    def _template_is_found(cls, fmt: str | None) -> str | None:
        if fmt is not None and fmt not in BUILTIN_FORMAT_PROMPTS and not fmt.startswith("/"):
            raise ValueError(
                f"{fmt!r} is neither a builtin template ({', '.join(BUILTIN_FORMAT_PROMPTS)}) "
                "nor an absolute path to a Jinja2 file in the pods")
        return fmt

    @classmethod
    def unknown_field_hint(cls, name: str) -> str | None:
        """What to write instead of a spec.trainer field that does not exist (as the
        trainer names it, camelCase, or the spec field's own name), or None."""
        for path, field in config_sources().items():
            key = path.split(".")[1]
            if name not in (key, to_camel(key), field.rsplit(".", 1)[-1]):
                continue
            if field.startswith("spec.trainer."):  # a field here, spelt the trainer's way
                return f"write it as {field.removeprefix('spec.trainer.')} (camelCase)"
            return (f"trainer setting {path} is the operator's: it sets it from {field}; "
                    "set that instead")
        return None

    def trainer_settings(self) -> dict[str, Any]:
        """The settings that are set, by trainer config path."""
        return {path: value for name, path in TRAINER_PATHS.items()
                if (value := getattr(self, name)) is not None}
