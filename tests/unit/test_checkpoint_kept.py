"""A checkpoint directory kept from an earlier job of the same name: the fence lets the
job created again take it over (and fences the earlier job's drivers out); checkpoints
of another model are refused, naming both."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from grpo_api.trainer_config import Config
from grpo_trainer.checkpointing.fence import AttemptSupersededError, check, claim
from grpo_trainer.checkpointing.model_guard import check_same_model, model_problem
from grpo_trainer.checkpointing.tracker import FENCE, Fence, taken_over_by
from grpo_trainer.config import build_config
from grpo_trainer.config_error import ConfigError

pytestmark = pytest.mark.unit


def test_only_a_fence_of_another_known_job_is_taken_over() -> None:
    assert taken_over_by("b", Fence(attempt=3, job_uid="a")) == "a"
    assert taken_over_by("a", Fence(attempt=3, job_uid="a")) is None  # our own: attempts
    assert taken_over_by("b", Fence(attempt=3)) is None  # an older trainer's: attempts
    assert taken_over_by(None, Fence(attempt=3, job_uid="a")) is None  # a local run
    assert taken_over_by("b", None) is None


def test_a_job_created_again_claims_the_directory_and_fences_the_earlier_one_out(
        tmp_path: Path) -> None:
    claim(tmp_path, 3, "uid-earlier")
    claim(tmp_path, 0, "uid-again")  # its attempt 0 against the earlier job's 3
    assert json.loads((tmp_path / FENCE).read_text()) == {"attempt": 0,
                                                          "job_uid": "uid-again"}
    check(tmp_path, 0, "committing checkpoint step 1", "uid-again")
    with pytest.raises(AttemptSupersededError) as err:  # its driver still ran somewhere
        check(tmp_path, 3, "committing checkpoint step 9", "uid-earlier")
    assert "job uid-again (created again under this job's name) has claimed" in str(err.value)
    with pytest.raises(AttemptSupersededError, match="attempt 1 is superseded: attempt 2"):
        claim(tmp_path, 2, "uid-again")
        claim(tmp_path, 1, "uid-again")  # within one job, attempts still order


def test_model_problem_names_both_models() -> None:
    root = Path("/checkpoints/ns/j")
    assert model_problem(root, 8, "/models/a/", "/models/a") is None
    assert model_problem(root, 8, "Qwen/Qwen2.5-VL-7B", "Qwen/Qwen2.5-VL-7B") is None
    problem = model_problem(root, 8, "/models/a", "/models/b")
    assert problem is not None
    assert "holds checkpoints of model /models/a (step 8)" in problem
    assert "this job trains /models/b" in problem and str(root) in problem


def test_the_guard_reads_the_checkpoint_a_start_would_resume(tmp_path: Path) -> None:
    step = tmp_path / "step-4"
    step.mkdir()
    (step / "config.yaml").write_text(yaml.safe_dump({"model": {"path": "/models/a"}}))
    (tmp_path / "latest").write_text(json.dumps({"step": 4, "dir": "step-4"}))

    def cfg(model: str) -> Config:
        return build_config({"model": {"path": model}, "data": {"train_files": ["x"]},
                             "checkpoint": {"dir": str(tmp_path)}}, environ={})

    check_same_model(cfg("/models/a"))
    with pytest.raises(ConfigError) as err:
        check_same_model(cfg("/models/b"))
    assert err.value.field == "model.path" and "/models/a" in str(err.value)
    check_same_model(build_config({"model": {"path": "/models/b"},  # no checkpoints yet
                                   "data": {"train_files": ["x"]},
                                   "checkpoint": {"dir": str(tmp_path / "new")}}, environ={}))
