"""Loading the trainer's config: YAML, ``--set`` and ``GRPO_*`` overrides, runtime checks.

The schema itself is grpo_api.trainer_config (the operator validates with it too).
Precedence, lowest first: model defaults < YAML file < ``--set key.path=value`` <
``GRPO_*`` environment.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from grpo_api.contract import Env
from grpo_api.job.memory_peaks import MemoryPeaks
from grpo_api.job.trainer import IDENTITY_ENV
from grpo_api.model.families import UnsupportedArchitecture, family_of
from grpo_api.trainer_config import BUILTIN_FORMAT_PROMPTS as BUILTIN_TEMPLATES
from grpo_api.trainer_config import Config

from .config_error import ConfigError

# GRPO_* variables the operator injects -> dotted config path (env wins). Only the job's
# identity (declared with every trainer path's source: the operator's config file does
# not carry it) and per-process switches: the planned settings come in the file alone.
ENV_OVERRIDES: dict[str, str] = {
    **IDENTITY_ENV,
    Env.FAULT_INJECT: "trainer.fault_inject",
    Env.TERMINATION_LOG: "trainer.termination_log",
}


def _normalise_env(value: str) -> Any:
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
        # Cross-field errors name their field first in the message ("a.b ..." or
        # "a.b: ...", the field then not repeated in the message).
        head, _, rest = msg.partition(" ")
        if "." in head:
            loc = head.removesuffix(":")
            msg = rest if head.endswith(":") else msg
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
            _set_path(tree, path, _normalise_env(env[name]))
    try:
        cfg = Config.model_validate(tree)
    except ValidationError as err:
        field, msg = _field_of(err)
        raise ConfigError(field, msg) from None
    planned_peaks(cfg)
    return cfg


def planned_peaks(cfg: Config) -> MemoryPeaks | None:
    """metrics.planned_peaks read as the status.plan.peaks it is (the trainer config's
    schema cannot name the API's type); ConfigError naming the field."""
    raw = cfg.metrics.planned_peaks
    try:
        return None if raw is None else MemoryPeaks.model_validate(raw)
    except ValidationError as err:
        field, msg = _field_of(err)
        raise ConfigError(f"metrics.planned_peaks.{field}", msg) from None


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
    model_config = local_model_config(cfg)
    check_model_family(cfg, model_config)
    check_engine_limits(cfg, model_config)


def local_model_config(cfg: Config) -> dict[str, Any] | None:
    """A local model's config.json; None for a hub id fetched later or no readable one
    (the load then says what is wrong)."""
    try:
        model_config = json.loads((Path(cfg.model.path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return model_config if isinstance(model_config, dict) else None


def check_model_family(cfg: Config, model_config: dict[str, Any] | None) -> None:
    """The trainer trains the families of grpo_api.model.families only, as the operator
    admits them: `grpo-train` run alone refuses any other before Ray starts."""
    if model_config is None:
        return
    try:
        family_of(model_config)
    except UnsupportedArchitecture as err:
        raise ConfigError("model.path", f"{err} (model.path {cfg.model.path})") from None


def check_engine_limits(cfg: Config, model_config: dict[str, Any] | None) -> None:
    """What the rollout engine cannot run, from the model's config.json (a local model's)."""
    if cfg.rollout.engine == "vllm" and cfg.actor.lora is not None:
        from .rollout.engine_limits import vllm_lora_rank

        try:
            vllm_lora_rank(cfg.actor.lora.rank)
        except ValueError as err:
            raise ConfigError("actor.lora.rank", str(err)) from None
    if cfg.rollout.engine != "vllm" or cfg.resources.trains_on_cuda or model_config is None:
        return  # only vLLM's CPU backend has a limit known before loading
    from .rollout.engine_limits import vllm_cpu_problem

    if problem := vllm_cpu_problem(model_config):
        raise ConfigError("rollout.engine", f"{problem} (model.path {cfg.model.path})")
