"""spec.data.val and spec.training.valIntervalSteps reach the trainer's config; the
deprecated spec.data.workers is accepted, ignored by the plan, and warned about."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from pydantic import ValidationError

from grpo_api.job import SpecError, parse_spec
from grpo_api.job.status import ProgressStatus
from grpo_api.trainer_config import Config
from grpo_operator.cli import cli
from grpo_operator.planner import plan_memory
from grpo_operator.planner.head import HEAD_CPUS, driver_gib
from grpo_operator.planner.resources import pod_need_gib
from grpo_operator.render.names import JobRef
from grpo_operator.render.trainer_config import trainer_config
from grpo_operator.webhook import admission_warnings
from grpo_trainer.liveness.progress import Progress

pytestmark = pytest.mark.unit
JOB = JobRef("j", "ns", "uid")
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def body(data: dict[str, Any] | None = None, **training: Any) -> dict[str, Any]:
    return {
        "model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"},
        "data": {"train": "/data/train.parquet", **(data or {})},
        "algorithm": {"rolloutN": 8},
        "training": {"rolloutBatchSize": 64, "globalBatchSize": 64, **training},
        "resources": {"gpuType": "H100-80GB", "nodes": 1, "gpusPerNode": 4},
        "checkpoint": {"size": "50Gi"},
    }


def test_val_split_and_interval_reach_the_trainer_config() -> None:
    spec = parse_spec(body({"val": "/data/val.parquet"}, valIntervalSteps=5))
    cfg = trainer_config(spec, plan_memory(spec), JOB)
    assert cfg["data"]["val_files"] == ["/data/val.parquet"]
    assert cfg["trainer"]["val_interval_steps"] == 5
    parsed = Config.model_validate(cfg)
    assert parsed.trainer.val_interval_steps == 5 and parsed.trainer.val_before_train


def test_no_interval_means_no_validation_in_the_trainer_config() -> None:
    spec = parse_spec(body({"val": "/data/val.parquet"}))
    assert trainer_config(spec, plan_memory(spec), JOB)["trainer"][
        "val_interval_steps"
    ] == 0


def test_an_interval_without_a_val_split_is_refused_naming_both_fields() -> None:
    with pytest.raises(SpecError, match=r"valIntervalSteps.*data\.val"):
        parse_spec(body(valIntervalSteps=5))
    raw = {"model": {"path": "m"}, "data": {"train_files": ["t"]},
           "trainer": {"val_interval_steps": 2}}
    with pytest.raises(ValidationError, match=r"val_interval_steps needs data\.val_files"):
        Config.model_validate(raw)


def test_data_workers_is_accepted_ignored_by_the_plan_and_warned_about() -> None:
    plain = parse_spec(body())
    legacy = parse_spec(body({"workers": 8}))  # a job written against the old schema
    assert plan_memory(legacy) == plan_memory(plain)
    assert plain.deprecation_warnings() == []
    assert admission_warnings(body()) == []
    [warning] = admission_warnings(body({"workers": 8}))
    assert warning.startswith("spec.data.workers is deprecated and ignored")
    assert "remove it" in warning
    # The head pod holds Ray, the driver and its row index (the length pass runs in the
    # head's own CPUs: planner/head.py): no memory or CPUs for data workers.
    plan = plan_memory(legacy)
    assert plan.head.cpus == HEAD_CPUS
    store = plan.settings.ray_object_store_gib
    assert pod_need_gib(plan.geometry, plan.settings, plan.budget, "head") == \
        driver_gib(plan.geometry) + store


def test_progress_reports_the_newest_validation_and_omits_it_before_any() -> None:
    from grpo_testbed.status_patch import apply_status_patch

    # An earlier attempt validated at step 2; this attempt has not validated yet.
    status = {"progress": {"step": 2, "valRewardMean": 0.25, "valStep": 2}}
    before = Progress(3, 10, 0.5).to_status()
    assert "valRewardMean" not in before and "valStep" not in before
    status = apply_status_patch(status, {"progress": before})  # as the API server merges
    assert status["progress"]["valRewardMean"] == 0.25 and status["progress"]["valStep"] == 2
    after = Progress(4, 10, 0.5, val_reward_mean=0.75, val_step=4).to_status()
    status = apply_status_patch(status, {"progress": after})
    assert status["progress"]["valRewardMean"] == 0.75 and status["progress"]["valStep"] == 4
    parsed = ProgressStatus.model_validate(status["progress"], by_alias=True, by_name=False)
    assert parsed.val_reward_mean == 0.75 and parsed.val_step == 4


def test_grpo_plan_warns_about_data_workers_on_stderr_only(tmp_path: Path) -> None:
    doc = yaml.safe_load((EXAMPLES / "grpojob-tiny.yaml").read_text())
    doc["spec"]["data"]["workers"] = 4
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    result = CliRunner().invoke(cli, ["plan", str(path), "--output", "json"])
    assert result.exit_code == 0
    json.loads(result.stdout)  # machine output stays clean
    assert "Warning: spec.data.workers is deprecated and ignored" in result.stderr
