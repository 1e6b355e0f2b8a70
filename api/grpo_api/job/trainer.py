"""Where each trainer config path's value comes from, declared once (SOURCES), and the
deprecated spec.trainer section.

A trainer path comes from exactly one of: a planned knob (grpo_api.knobs: the planner
resolves it), a spec field the operator renders it from, a spec field passed on as it is
(`passed`), or the job's identity (the operator's env, which the trainer reads over its
config; not in the per-attempt config). The operator's render, admission's messages and
the trainer's env overrides all read this table, and a path declared twice fails at
import.

The passed-on settings are the EasyR1-style ones no planner decision depends on; each
field's type and bounds are the trainer schema's own (`spec_setting`), so the API
server, the webhook and the trainer refuse the same values, and the operator validates
the whole rendered config with that schema at apply. spec.trainer once held them: it is
kept open in the CRD so that an old manifest applies (its values move to their new
fields: renames.py) and a planned setting written there reaches the webhook, which
refuses it naming the spec field that sets it (`unknown_field_hint`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ConfigDict, Field
from pydantic.alias_generators import to_camel, to_snake

from .. import knobs
from ..contract import Env
from ..knobs import Knob
from ..trainer_config import BUILTIN_FORMAT_PROMPTS, Config, KLEstimator
from .base import ApiModel


@dataclass(frozen=True)
class Source:
    """Where one trainer config path's value comes from: `knob`, `passed` or `env` says
    which kind (none of them: rendered from `field`)."""

    path: str  # dotted trainer config path
    field: str  # the spec field that sets it, as messages name it
    knob: Knob | None = None  # planned: the plan's value for this knob
    passed: str | None = None  # the spec field (wire path under spec), passed on as set
    env: Env | None = None  # the job's identity: this env var of the Ray containers


def planned(knob: Knob, path: str) -> Source:
    return Source(path, knob.spec_path, knob=knob)


def rendered(path: str, field: str) -> Source:
    return Source(path, field)


def passed(spec_path: str, path: str) -> Source:
    return Source(path, f"spec.{spec_path}", passed=spec_path)


def identity(path: str, env: Env, field: str) -> Source:
    return Source(path, field, env=env)


def one_each(sources: Iterable[Source]) -> Mapping[str, Source]:
    """The sources by path; a path declared twice is an error (no order may decide)."""
    out: dict[str, Source] = {}
    for source in sources:
        if source.path in out:
            raise ValueError(f"trainer path {source.path} is declared twice: "
                             f"{out[source.path]} and {source}")
        out[source.path] = source
    return out


SOURCES: Mapping[str, Source] = one_each((
    # The plan's knobs (Ray's object store is Ray's, not the trainer's: no path).
    planned(knobs.RANK0_INIT, "actor.init_strategy"),
    planned(knobs.OFFLOAD_PARAMS, "actor.offload_params"),
    planned(knobs.OFFLOAD_OPTIMIZER, "actor.offload_optimizer"),
    planned(knobs.GRADIENT_CHECKPOINTING, "actor.gradient_checkpointing"),
    planned(knobs.MICRO_BATCH_SIZE, "actor.micro_batch_size"),
    planned(knobs.MICRO_BATCH_TOKENS, "actor.micro_batch_tokens"),
    planned(knobs.ROLLOUT_GPU_MEMORY_UTILIZATION, "rollout.gpu_memory_utilization"),
    planned(knobs.ROLLOUT_N, "rollout.n"),
    planned(knobs.PRECISION, "actor.precision"),
    planned(knobs.ROLLOUT_TENSOR_PARALLEL, "rollout.tensor_parallel_size"),
    # Rendered from the spec (render/trainer_config.py).
    rendered("model.path", "spec.model.path"),
    rendered("data.train_files", "spec.data.train"),
    rendered("data.val_files", "spec.data.val"),
    rendered("data.prompt_key", "spec.data.promptKey"),
    rendered("data.answer_key", "spec.data.answerKey"),
    rendered("data.image_key", "spec.data.imageKey"),
    rendered("data.max_prompt_length", "spec.data.maxPromptLength"),
    rendered("data.seed", "spec.training.seed"),
    rendered("data.image_max_pixels", "spec.data.maxPixels"),
    rendered("data.image_min_pixels", "spec.data.maxPixels"),
    rendered("data.overlong_prompts", "spec.data.overlongPrompts"),
    rendered("data.max_images_per_prompt", "spec.data.maxImagesPerPrompt"),
    rendered("data.video_key", "spec.data.videoKey"),
    rendered("data.max_videos_per_prompt", "spec.data.maxVideosPerPrompt"),
    rendered("data.video_fps", "spec.data.videoFps"),
    rendered("data.max_frames", "spec.data.maxFrames"),
    rendered("data.video_max_pixels", "spec.data.videoMaxPixels"),
    rendered("data.video_min_pixels", "spec.data.videoMaxPixels"),
    rendered("data.bad_rows", "spec.data.badRows"),
    rendered("data.prompt_lengths", "spec.data.promptLengths"),
    rendered("data.length_workers", "the head pod's CPUs (status.plan)"),
    rendered("rollout.engine", "spec.rollout.engine"),
    rendered("rollout.temperature", "spec.algorithm.temperature"),
    rendered("rollout.top_p", "spec.algorithm.topP"),
    rendered("rollout.max_new_tokens", "spec.data.maxResponseLength"),
    rendered("rollout.seed", "spec.training.seed"),
    # Disaggregated jobs only (a colocated job's config leaves the trainer's defaults).
    rendered("rollout.placement", "spec.rollout.placement"),
    rendered("rollout.max_staleness", "spec.rollout.maxStaleness"),
    rendered("rollout.disaggregated", "spec.rollout.disaggregated"),
    rendered("algorithm.clip_ratio_low", "spec.algorithm.clipRatioLow"),
    rendered("algorithm.clip_ratio_high", "spec.algorithm.clipRatioHigh"),
    rendered("algorithm.kl_coef", "spec.algorithm.klCoef"),
    rendered("actor.lr", "spec.training.learningRate"),
    rendered("actor.weight_decay", "spec.training.weightDecay"),
    rendered("actor.max_grad_norm", "spec.training.maxGradNorm"),
    rendered("actor.mini_batch_size", "spec.training.globalBatchSize"),
    rendered("actor.dtype", "spec.resources.gpuType"),
    rendered("actor.lora", "spec.lora"),
    rendered("resources.num_workers", "spec.resources.nodes x spec.resources.gpusPerNode"),
    rendered("resources.nodes", "spec.resources.nodes"),
    rendered("resources.ranks_per_node", "spec.resources.gpusPerNode"),
    rendered("resources.ranks_on_head", "spec.resources.nodes"),
    rendered("resources.gpus_per_worker", "spec.resources.gpuType"),
    rendered("resources.cpus_per_worker", "spec.resources.cpusPerNode"),
    rendered("resources.ray_address", "spec.resources"),
    rendered("reward.type", "spec.reward.type"),
    rendered("reward.function", "spec.reward.function"),
    rendered("reward.format_weight", "spec.reward.formatWeight"),
    rendered("reward.batch", "spec.reward.batch"),
    rendered("reward.kwargs", "spec.reward.kwargs"),
    rendered("reward.http", "spec.reward.http"),
    rendered("checkpoint.interval_steps", "spec.checkpoint.intervalSteps"),
    rendered("checkpoint.keep", "spec.checkpoint.keep"),
    rendered("checkpoint.async_save", "spec.checkpoint.asyncSave"),
    rendered("checkpoint.export",
             "the operator (every job exports its final model: status.export)"),
    rendered("checkpoint.store", "spec.checkpoint.store (the job's prefix below its uri)"),
    rendered("metrics.prometheus_port", "spec.logging"),
    rendered("metrics.progress_bar", "spec.logging"),
    rendered("metrics.tensorboard_dir", "spec.logging.tensorboard"),
    rendered("metrics.wandb", "spec.logging.wandb"),
    rendered("metrics.mlflow", "spec.logging.mlflow"),
    rendered("metrics.planned_peaks",
             "the plan (status.plan.peaks: the figures the trainer's readings stand beside)"),
    rendered("trainer.total_steps", "spec.training.maxSteps"),
    rendered("trainer.epochs", "spec.training.epochs"),
    rendered("trainer.rollout_batch_size", "spec.training.rolloutBatchSize"),
    rendered("trainer.seed", "spec.training.seed"),
    rendered("trainer.val_interval_steps", "spec.training.valIntervalSteps"),
    rendered("trainer.stall_timeout_s", "spec.recovery.stallTimeoutSeconds"),
    # EasyR1-style settings no planner decision depends on, passed on as set (their bounds
    # are the trainer schema's: spec_setting).
    passed("data.promptTemplate", "data.format_prompt"),
    passed("algorithm.entropyCoef", "algorithm.entropy_coef"),
    passed("algorithm.clipRatioDual", "algorithm.clip_ratio_dual"),
    passed("algorithm.offpolicyIsCap", "algorithm.offpolicy_is_cap"),
    passed("algorithm.klEstimator", "algorithm.kl_estimator"),
    passed("algorithm.normAdvByStd", "algorithm.norm_adv_by_std"),
    passed("algorithm.ppoEpochs", "actor.ppo_epochs"),
    passed("training.warmupSteps", "actor.warmup_steps"),
    passed("training.valBeforeTrain", "trainer.val_before_train"),
    passed("reward.timeoutSeconds", "reward.timeout_s"),
    passed("reward.workers", "reward.num_workers"),
    # The job's identity, once, as env: every process of the Ray containers reads it (the
    # driver over its config file, the worker's preStop hook, Ray's rank actors), and so
    # do the head's hub-fetch step and spec.pods' init containers ($(GRPO_CHECKPOINT_DIR)),
    # which do not read the config file.
    identity("checkpoint.dir", Env.CHECKPOINT_DIR, "spec.checkpoint"),
    identity("trainer.job_name", Env.JOB_NAME, "metadata.name"),
    identity("trainer.job_namespace", Env.JOB_NAMESPACE, "metadata.namespace"),
    identity("trainer.job_uid", Env.JOB_UID, "metadata.uid"),
    identity("trainer.attempt", Env.ATTEMPT, "the operator's attempt count"),
))

# Views of SOURCES, by kind.
PLANNED = tuple(s for s in SOURCES.values() if s.knob is not None)
IDENTITY_ENV: Mapping[str, str] = {s.env.value: s.path for s in SOURCES.values() if s.env}
"""Env var -> the trainer config path it sets (the trainer reads them over its config)."""
PASSED: Mapping[str, str] = {s.passed: s.path for s in SOURCES.values() if s.passed}
"""The spec fields passed on as set (wire paths under spec) -> the trainer path of each."""


def config_sources() -> dict[str, str]:
    """Every trainer config path the operator sets -> the spec field that sets it."""
    return {path: s.field for path, s in SOURCES.items()}


def spec_setting(spec_path: str, description: str) -> Any:
    """The spec field at `spec_path` (wire, under spec), passed on as it is: the trainer
    schema's bounds for its trainer path and its default named in the description
    (unset: the trainer's default)."""
    path = PASSED[spec_path]
    section, key = path.split(".")
    model = Config.model_fields[section].annotation
    assert isinstance(model, type), path
    info = model.model_fields[key]
    bounds = {b: getattr(m, b) for m in info.metadata for b in ("ge", "gt", "le", "lt")
              if getattr(m, b, None) is not None}
    return Field(None, description=f"{description} Unset: {info.default}. Trainer "
                 f"setting {path}.", **bounds)


def passed_settings(spec: Any) -> dict[str, Any]:
    """The passed-on settings a parsed spec sets, by trainer config path."""
    out: dict[str, Any] = {}
    for spec_path, path in PASSED.items():
        node = spec
        for key in spec_path.split("."):
            node = getattr(node, to_snake(key))
        if node is not None:
            out[path] = node
    return out


def template_problem(fmt: str | None) -> str | None:
    """Why a prompt template setting names no template, or None."""
    if fmt is not None and fmt not in BUILTIN_FORMAT_PROMPTS and not fmt.startswith("/"):
        return (f"{fmt!r} is neither a builtin template ({', '.join(BUILTIN_FORMAT_PROMPTS)}) "
                "nor an absolute path to a Jinja2 file in the pods")
    return None


def _deprecated(new: str) -> Any:
    """A spec.trainer field kept so old manifests apply: its value moves to `new`."""
    return Field(None, description=f"Deprecated: the old name of spec.{new}, where its value "
                 "moves (admission warns).")


class TrainerSpec(ApiModel):
    """Deprecated: the EasyR1-style settings that were here live in spec.algorithm,
    spec.training, spec.reward and spec.data now (a value set here moves there, and
    admission warns). A planned setting written here is refused, naming its field."""

    # Open in the CRD: a setting that is not a field here (a planned one) reaches the
    # webhook, which names the spec field to use instead of the API server's bare
    # "unknown field".
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})

    format_prompt: str | None = _deprecated("data.promptTemplate")
    entropy_coef: float | None = _deprecated("algorithm.entropyCoef")
    clip_ratio_dual: float | None = _deprecated("algorithm.clipRatioDual")
    offpolicy_is_cap: float | None = _deprecated("algorithm.offpolicyIsCap")
    kl_estimator: KLEstimator | None = _deprecated("algorithm.klEstimator")
    norm_adv_by_std: bool | None = _deprecated("algorithm.normAdvByStd")
    warmup_steps: int | None = _deprecated("training.warmupSteps")
    ppo_epochs: int | None = _deprecated("algorithm.ppoEpochs")
    reward_timeout_seconds: float | None = _deprecated("reward.timeoutSeconds")
    reward_workers: int | None = _deprecated("reward.workers")
    val_before_train: bool | None = _deprecated("training.valBeforeTrain")

    @classmethod
    def unknown_field_hint(cls, name: str) -> str | None:
        """What to write instead of a spec.trainer field that does not exist (as the
        trainer names it, camelCase, or the spec field's own name), or None."""
        for path, field in config_sources().items():
            key = path.split(".")[1]
            if name not in (key, to_camel(key), field.rsplit(".", 1)[-1]):
                continue
            if SOURCES[path].passed:  # a setting passed on as it is: where it is written
                return f"write it as {field}"
            return (f"trainer setting {path} is the operator's: it sets it from {field}; "
                    "set that instead")
        return None
