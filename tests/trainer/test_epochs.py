"""spec.training.epochs reaches the trainer: with maxSteps unset, a job runs that many
passes over its train split, rendered by the operator and run by the real trainer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grpo_api.job import parse_spec
from grpo_operator.planner import plan_memory
from grpo_operator.render import JobRef
from grpo_operator.render.trainer_config import trainer_config
from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.liveness.progress import JsonFileProgressReporter

pytestmark = pytest.mark.trainer


def rendered_schedule(training: dict[str, Any]) -> dict[str, Any]:
    """The `trainer` schedule keys of the ConfigMap the operator renders for a cpu job."""
    spec = parse_spec(
        {
            "model": {"path": "/models/m", "shape": {
                "parameters": 10**6, "layers": 2, "hiddenSize": 64, "intermediateSize": 128,
                "attentionHeads": 4, "kvHeads": 2, "vocabSize": 448}},
            "data": {"train": "/data/t.jsonl", "maxPromptLength": 64, "maxResponseLength": 16,
                     "workers": 0},
            "algorithm": {"rolloutN": 8},
            "training": {"rolloutBatchSize": 4, "globalBatchSize": 32, **training},
            "resources": {"gpuType": "cpu", "nodes": 0, "gpusPerNode": 2, "hostMemory": "16Gi"},
            "checkpoint": {"size": "1Gi"},
        }
    )
    cfg = trainer_config(spec, plan_memory(spec), JobRef("j", "ns", "u"))
    return {k: v for k, v in cfg["trainer"].items() if k in ("epochs", "total_steps")}


def test_two_epochs_over_ten_prompts_run_four_steps(
    tiny_lm: Path, tmp_path: Path, ray_local: None
) -> None:
    schedule = rendered_schedule({"epochs": 2})
    assert schedule == {"epochs": 2}
    data = write_text_task(tmp_path / "text.jsonl", rows=10)  # 2 steps of 4 per pass
    raw = text_config(tiny_lm, data, metrics={"progress_file": str(tmp_path / "p.json")})
    raw["trainer"] = {"rollout_batch_size": 4, **schedule}
    cfg = build_config(raw, environ={})
    assert cfg.metrics.progress_file is not None
    trainer = GRPOTrainer(cfg, reporter=JsonFileProgressReporter(cfg.metrics.progress_file, 0.0))
    try:
        history = trainer.run()
    finally:
        trainer.close()
    assert len(history) == 4
    progress = json.loads((tmp_path / "p.json").read_text())
    assert (progress["step"], progress["totalSteps"]) == (4, 4)
    assert trainer.loader.state_dict()["epoch"] == 1  # the second pass, fully consumed
    assert trainer.loader.state_dict()["offset"] == 8


def test_max_steps_wins_over_epochs() -> None:
    assert rendered_schedule({"epochs": 3, "maxSteps": 5}) == {"epochs": 3, "total_steps": 5}
