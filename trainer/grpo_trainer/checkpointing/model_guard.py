"""A checkpoint directory resumes only the model it was trained from.

A job deleted with its claim kept (checkpoint.retention Retain) and created again under
the same name finds the earlier job's checkpoints in ``/checkpoints/<ns>/<job>/``. If
that job trained another model, loading them would fail deep in DCP (or, for two
models of one shape, silently continue the wrong one): the same rule as changing a
running job's model (the webhook refuses spec.model edits) is checked here, before Ray
starts or anything in the directory is touched, from the resolved config each step
directory keeps (``tracker.CONFIG``).
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml

from grpo_api.trainer_config import Config

from ..config_error import ConfigError
from .dcp import committed_step
from .tracker import CONFIG, step_dir_name


def _same(a: str, b: str) -> bool:
    """One model named two ways: a trailing slash, `a/./b`; hub ids compare as written."""
    return os.path.normpath(a) == os.path.normpath(b)


def model_problem(root: Path, step: int, saved: str, mine: str) -> str | None:
    """Why this job cannot resume from checkpoints of model `saved`, or None."""
    if _same(saved, mine):
        return None
    return (f"checkpoint directory {root} holds checkpoints of model {saved} (step {step}), "
            f"but this job trains {mine}: a job resumes only its own model's checkpoints "
            "(spec.model cannot change on a running job either). A job created again under "
            "the same name adopts the checkpoint claim its predecessor left: give this job "
            "another name or checkpoint claim, or remove that directory to start over")


def saved_model(root: Path) -> tuple[int, str] | None:
    """(step, model path) of the checkpoint a start would resume from; None when there is
    none or its config cannot be read (the load then decides)."""
    step = committed_step(root)
    if step is None:
        return None
    try:
        saved = yaml.safe_load((root / step_dir_name(step) / CONFIG).read_text())
        return step, str(saved["model"]["path"])
    except (OSError, yaml.YAMLError, KeyError, TypeError):
        return None


def check_same_model(cfg: Config) -> None:
    """Raise ConfigError (exit 2) naming both models when ``checkpoint.dir`` holds
    checkpoints of another model than ``model.path``."""
    if cfg.checkpoint.dir is None:
        return
    root = Path(cfg.checkpoint.dir)
    found = saved_model(root)
    if found is None:
        return
    problem = model_problem(root, found[0], found[1], cfg.model.path)
    if problem:
        raise ConfigError("model.path", problem)
