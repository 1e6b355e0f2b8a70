"""Trainer configuration: pydantic models, YAML loading, ``--set`` and ``GRPO_*`` overrides.

Torch- and Ray-free on purpose: the operator imports this module to render and
validate the per-attempt config it puts in a ConfigMap. Precedence, lowest first:
model defaults < YAML file < ``--set key.path=value`` < ``GRPO_*`` environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from grpo_operator.contract import Env


class ConfigError(ValueError):
    """A bad trainer config; ``field`` names the offending dotted path."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class InitStrategy(StrEnum):
    """How weights reach the FSDP shards (docs/incidents.md #1)."""

    RANK0 = "rank0"  # rank 0 reads the checkpoint, the others start on the meta device
    SHARDED = "sharded"  # every rank reads only its own rows from the safetensors files
    NAIVE = "naive"  # every rank reads everything: benchmark baseline only


class ModelConfig(_Strict):
    path: str = Field(description="Hugging Face model directory (safetensors) or hub id")
    tokenizer_path: str | None = None
    trust_remote_code: bool = False
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"


class DataConfig(_Strict):
    train_files: list[str] = Field(min_length=1)
    val_files: list[str] = Field(default_factory=list)
    prompt_key: str = "problem"
    answer_key: str = "answer"
    image_key: str = "images"
    # A builtin template name ("math", "r1v", "plain") or a path to a Jinja2 file.
    format_prompt: str = "plain"
    max_prompt_length: int = Field(default=512, gt=0)
    shuffle: bool = True
    seed: int = 1
    image_max_pixels: int = Field(default=512 * 28 * 28, gt=0)
    image_min_pixels: int = Field(default=4 * 28 * 28, gt=0)


class RolloutConfig(_Strict):
    engine: Literal["hf", "vllm"] = "hf"
    # hf engine: "native" is a lean KV-cached sampling loop, "generate" calls
    # transformers' generate (the reference; slower per token on CPUs).
    hf_sampler: Literal["native", "generate"] = "native"
    n: int = Field(default=8, ge=2, description="generations per prompt (the GRPO group)")
    temperature: float = Field(default=1.0, gt=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_new_tokens: int = Field(default=256, gt=0)
    gpu_memory_utilization: float = Field(default=0.6, gt=0, lt=1)
    tensor_parallel_size: int = Field(
        default=1,
        ge=1,
        description="vLLM: consecutive ranks that share one engine, sharded across them",
    )
    seed: int = 1
    # vLLM only: free weights + KV cache between rollouts so FSDP gets the GPU.
    enable_sleep_mode: bool = True


class AlgorithmConfig(_Strict):
    adv_estimator: Literal["grpo"] = "grpo"
    norm_adv_by_std: bool = True
    clip_ratio_low: float = Field(default=0.2, ge=0)
    clip_ratio_high: float = Field(default=0.3, ge=0)
    clip_ratio_dual: float | None = Field(default=3.0, gt=1)
    kl_coef: float = Field(default=0.0, ge=0)
    kl_estimator: Literal["k1", "k3", "low_var_kl"] = "low_var_kl"
    entropy_coef: float = Field(default=0.0, ge=0)


class ActorConfig(_Strict):
    lr: float = Field(default=1e-6, gt=0)
    weight_decay: float = Field(default=1e-2, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = Field(default=0, ge=0)
    max_grad_norm: float = Field(default=1.0, gt=0)
    ppo_epochs: int = Field(default=1, ge=1)
    # Samples (not prompts) per optimizer step, over all ranks.
    mini_batch_size: int | None = Field(default=None, gt=0)
    # Samples per forward/backward on one rank.
    micro_batch_size: int = Field(default=2, gt=0)
    dtype: Literal["bfloat16", "float32"] = Field(
        default="bfloat16", description="compute dtype; master weights stay float32"
    )
    init_strategy: InitStrategy = InitStrategy.RANK0
    # False keeps each block's gathered parameters from forward to backward: one
    # all-gather per block per micro-batch instead of two, for one block of extra
    # memory each. Worth it where the collective is slow relative to compute (gloo).
    reshard_after_forward: bool = True
    # Update forward: each group's prompt once, its n responses attending to it through
    # a 4-D mask (same log-probs; P + sum(R) tokens instead of n*P + sum(R)). Text-only
    # batches with sdpa or eager attention; others take the plain padded layout.
    shared_prefix: bool = True
    offload_params: bool = False
    offload_optimizer: bool = False
    gradient_checkpointing: bool = False


class ResourcesConfig(_Strict):
    num_workers: int = Field(default=1, ge=1, description="FSDP ranks (Ray actors)")
    gpus_per_worker: float = Field(default=0, ge=0)
    cpus_per_worker: float = Field(default=1, gt=0)
    ray_address: str | None = Field(
        default=None, description="None: join a running cluster if any, else start a local one"
    )
    object_store_memory: int | None = Field(default=None, gt=0)


class RewardConfig(_Strict):
    type: Literal["math", "r1v", "function"] = "math"
    function: str | None = Field(default=None, description="'module:callable' for type=function")
    format_weight: float = Field(default=0.1, ge=0, le=1)
    num_workers: int = Field(default=4, ge=1)
    timeout_s: float = Field(default=30.0, gt=0)

    @model_validator(mode="after")
    def _function_named(self) -> RewardConfig:
        if self.type == "function" and not self.function:
            raise ValueError("reward.function is required when reward.type is 'function'")
        return self


class CheckpointConfig(_Strict):
    dir: str | None = None
    # 0: only at the end of training.
    interval_steps: int = Field(default=0, ge=0)
    keep: int = Field(default=2, ge=1)
    # Stage a CPU copy and write it in the background while training goes on; the
    # tracker still moves only once the whole save is on disk.
    async_save: bool = False


class MetricsConfig(_Strict):
    jsonl: bool = True
    tensorboard_dir: str | None = None
    prometheus_port: int | None = Field(default=None, ge=0, le=65535)
    progress_bar: Literal["auto", "on", "off"] = "auto"
    progress_file: str | None = None


class WatchdogConfig(_Strict):
    """Memory watchdog (docs/trainer.md "Memory watchdog"): flags sustained growth of a
    process's host RSS or GPU memory, per step, as a metric, a log line and the job's
    status.progress.memoryGrowth."""

    enabled: bool = True
    window_steps: int = Field(default=20, ge=4, description="steps in the sliding window")
    warmup_steps: int = Field(default=5, ge=0, description="first steps not watched")
    threshold_mib_per_step: float = Field(
        default=2.0, gt=0, description="least-squares growth over the window that flags"
    )
    min_positive_fraction: float = Field(
        default=0.6, ge=0, le=1, description="share of step-to-step deltas that must be > 0"
    )


class TrainerConfig(_Strict):
    total_steps: int | None = Field(
        default=None, ge=1, description="stop after this many steps; unset: run `epochs`"
    )
    epochs: int = Field(default=1, ge=1, description="passes over the train split")
    rollout_batch_size: int = Field(default=8, gt=0, description="prompts per step")
    seed: int = 1
    job_name: str | None = None
    job_namespace: str | None = None
    attempt: int = Field(default=0, ge=0)
    termination_log: str | None = None
    fault_inject: str | None = None

    def steps(self, prompts: int) -> int:
        """Steps to run over `prompts` train prompts: total_steps when set (it wins, as
        max_steps does in Hugging Face's Trainer), else epochs x whole batches per pass
        (the loader drops a pass's tail that does not fill a batch)."""
        if self.total_steps is not None:
            return self.total_steps
        return self.epochs * max(1, prompts // self.rollout_batch_size)


class Config(_Strict):
    model: ModelConfig
    data: DataConfig
    rollout: RolloutConfig = RolloutConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    actor: ActorConfig = ActorConfig()
    resources: ResourcesConfig = ResourcesConfig()
    reward: RewardConfig = RewardConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    metrics: MetricsConfig = MetricsConfig()
    watchdog: WatchdogConfig = WatchdogConfig()
    trainer: TrainerConfig = TrainerConfig()

    @property
    def samples_per_step(self) -> int:
        return self.trainer.rollout_batch_size * self.rollout.n

    @property
    def mini_batch_samples(self) -> int:
        return self.actor.mini_batch_size or self.samples_per_step

    @model_validator(mode="after")
    def _batch_sizes_divide(self) -> Config:
        world = self.resources.num_workers
        total = self.samples_per_step
        if self.trainer.rollout_batch_size % world:
            raise ValueError(
                f"trainer.rollout_batch_size ({self.trainer.rollout_batch_size}) must be "
                f"divisible by resources.num_workers ({world}) so each rank gets whole groups"
            )
        mini = self.mini_batch_samples
        if total % mini:
            raise ValueError(
                f"actor.mini_batch_size ({mini}) must divide "
                f"rollout_batch_size * rollout.n ({total})"
            )
        if mini % world:
            raise ValueError(
                f"actor.mini_batch_size ({mini}) must be divisible by "
                f"resources.num_workers ({world})"
            )
        tp = self.rollout.tensor_parallel_size
        if tp > 1 and self.rollout.engine != "vllm":
            raise ValueError(
                f"rollout.tensor_parallel_size ({tp}) needs rollout.engine 'vllm'; "
                "the hf engine runs one model per rank"
            )
        if world % tp:
            raise ValueError(
                f"rollout.tensor_parallel_size ({tp}) must divide resources.num_workers "
                f"({world}): each engine spans whole groups of ranks"
            )
        if (mini // world) % self.actor.micro_batch_size:
            raise ValueError(
                f"actor.micro_batch_size ({self.actor.micro_batch_size}) must divide the per-rank "
                f"mini-batch ({mini // world})"
            )
        return self


# GRPO_* variables the operator injects -> dotted config path (env wins).
ENV_OVERRIDES: dict[str, str] = {
    Env.RANK0_INIT: "actor.init_strategy",
    Env.OFFLOAD_PARAMS: "actor.offload_params",
    Env.OFFLOAD_OPTIMIZER: "actor.offload_optimizer",
    Env.GRADIENT_CHECKPOINTING: "actor.gradient_checkpointing",
    Env.MICRO_BATCH_SIZE: "actor.micro_batch_size",
    Env.ROLLOUT_GPU_MEMORY_UTILIZATION: "rollout.gpu_memory_utilization",
    Env.ROLLOUT_N: "rollout.n",
    Env.ROLLOUT_TENSOR_PARALLEL: "rollout.tensor_parallel_size",
    Env.CHECKPOINT_DIR: "checkpoint.dir",
    Env.JOB_NAME: "trainer.job_name",
    Env.JOB_NAMESPACE: "trainer.job_namespace",
    Env.ATTEMPT: "trainer.attempt",
    Env.FAULT_INJECT: "trainer.fault_inject",
    "GRPO_TERMINATION_LOG": "trainer.termination_log",
}


def _normalise_env(path: str, value: str) -> Any:
    if path == "actor.init_strategy":
        # The operator speaks booleans as well as strategy names.
        low = value.strip().lower()
        return {"true": "rank0", "1": "rank0", "false": "sharded", "0": "sharded"}.get(low, low)
    return yaml.safe_load(value) if value.strip() else value


def _set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for i, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(
                ".".join(keys[: i + 1]), "is not a section, cannot set a key under it"
            )
        node = child
    node[keys[-1]] = value


def parse_set(item: str) -> tuple[str, Any]:
    """``key.path=value`` with the value parsed as YAML (so ``3``, ``true``, ``[a, b]`` work)."""
    if "=" not in item:
        raise ConfigError(item, "--set expects key.path=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(item, "--set expects key.path=value")
    return key, (yaml.safe_load(raw) if raw.strip() else raw)


def _field_of(err: ValidationError) -> tuple[str, str]:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "config"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown field"
    elif first["type"] == "value_error" and msg.startswith("Value error, "):
        msg = msg.removeprefix("Value error, ")
        # Cross-field errors name their field first in the message.
        loc = msg.split(" ", 1)[0] if "." in msg.split(" ", 1)[0] else loc
    return loc, msg


def build_config(
    raw: Mapping[str, Any],
    overrides: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Merge file contents, ``--set`` items and ``GRPO_*`` env, then validate."""
    tree: dict[str, Any] = yaml.safe_load(yaml.safe_dump(dict(raw))) or {}
    for item in overrides:
        _set_path(tree, *parse_set(item))
    env = os.environ if environ is None else environ
    for name, path in ENV_OVERRIDES.items():
        if name in env:
            _set_path(tree, path, _normalise_env(path, env[name]))
    try:
        return Config.model_validate(tree)
    except ValidationError as err:
        field, msg = _field_of(err)
        raise ConfigError(field, msg) from None


def load_config(
    path: str | Path, overrides: Sequence[str] = (), environ: Mapping[str, str] | None = None
) -> Config:
    p = Path(path)
    try:
        raw = yaml.safe_load(p.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError("--config", f"file not found: {p}") from None
    except yaml.YAMLError as err:
        raise ConfigError("--config", f"invalid YAML in {p}: {err}") from None
    if not isinstance(raw, dict):
        raise ConfigError("--config", f"{p} must hold a mapping at the top level")
    return build_config(raw, overrides, environ)


def check_runtime(cfg: Config) -> None:
    """Checks that need the trainer's filesystem (the operator cannot do them)."""
    for key in ("train_files", "val_files"):
        for i, f in enumerate(getattr(cfg.data, key)):
            base = f.rpartition("@")[0]  # <dir>@<split>: a fetched hub dataset
            if not (Path(f).exists() or (base and Path(base).is_dir())):
                raise ConfigError(f"data.{key}[{i}]", f"file not found: {f}")
    fmt = cfg.data.format_prompt
    if fmt not in BUILTIN_TEMPLATES and not Path(fmt).exists():
        raise ConfigError(
            "data.format_prompt", f"neither a builtin ({', '.join(BUILTIN_TEMPLATES)}) nor a file"
        )
    model = Path(cfg.model.path)
    if (model.is_absolute() or cfg.model.path.startswith(".")) and not model.exists():
        raise ConfigError("model.path", f"directory not found: {model}")


BUILTIN_TEMPLATES = ("plain", "math", "r1v")
