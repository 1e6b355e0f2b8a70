"""A kept checkpoint directory (checkpoint.retention Retain) and the exported model, with
the real trainer (tiny Qwen2, 2 gloo ranks on a local Ray):

- a finished run exports its final model (checkpoint.export) to <dir>/export and says
  so in its termination message (the operator's status.export);
- a job created again under the same name (a new uid, attempt 0 against the earlier
  job's attempt 3 in the fence) resumes from the last checkpoint and does not export
  twice;
- a job of another model on that directory exits 2 naming both models, touching
  nothing."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from grpo_api.contract import ExitCode
from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_trainer.checkpointing.export import load_model_tensors
from grpo_trainer.checkpointing.tracker import EXPORT_MARKER, FENCE
from grpo_trainer.run import run_training

pytestmark = pytest.mark.trainer

STEPS = 2


def train(tmp: Path, model: Path, data: Path, ckpt: Path, monkeypatch: pytest.MonkeyPatch,
          **trainer: Any) -> tuple[int, dict[str, Any]]:
    """One run of `python -m grpo_trainer` as the operator configures it; its exit code
    and termination message."""
    term = tmp / "termination-log"
    term.unlink(missing_ok=True)
    monkeypatch.setenv("GRPO_TERMINATION_LOG", str(term))
    cfg = text_config(model, data, checkpoint={"dir": str(ckpt), "interval_steps": 1,
                                               "export": True},
                      trainer={"total_steps": STEPS, **trainer})
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    code = run_training(str(path))
    return code, json.loads(term.read_text()) if term.exists() else {}


@pytest.fixture(scope="module")
def finished(tiny_lm: Path, tmp_path_factory: pytest.TempPathFactory,
             ray_local: None) -> tuple[Path, Path, dict[str, Any]]:
    """An earlier job's run that finished at its attempt 3: (checkpoint dir, data, its
    termination message)."""
    tmp = tmp_path_factory.mktemp("kept")
    data = write_text_task(tmp / "t.jsonl")
    ckpt = tmp / "ckpt"
    with pytest.MonkeyPatch.context() as mp:
        code, msg = train(tmp, tiny_lm, data, ckpt, mp, job_uid="uid-earlier", attempt=3)
    assert code == ExitCode.FINISHED, msg
    return ckpt, data, msg


def test_a_finished_run_exports_its_final_model_and_reports_where(
        finished: tuple[Path, Path, dict[str, Any]]) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ckpt, _, msg = finished
    out = ckpt / "export"
    assert msg["reason"] == "Succeeded" and msg["step"] == STEPS
    assert msg["export"] == {"path": str(out), "step": STEPS}
    assert json.loads((out / EXPORT_MARKER).read_text()) == {"step": STEPS}
    assert not (ckpt / "export.partial").exists()
    model = AutoModelForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)  # the processor side came along
    trained = load_model_tensors(ckpt / f"step-{STEPS}")
    exported = model.state_dict()
    assert set(trained) <= set(exported)
    for name, tensor in trained.items():
        assert torch.equal(exported[name], tensor.to(exported[name].dtype)), name


def test_a_job_created_again_takes_the_directory_over_and_resumes(
        finished: tuple[Path, Path, dict[str, Any]], tiny_lm: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    earlier, data, _ = finished
    ckpt = tmp_path / "ckpt"
    shutil.copytree(earlier, ckpt)
    marker = (ckpt / "export" / EXPORT_MARKER).stat().st_mtime_ns
    with caplog.at_level(logging.INFO):
        code, msg = train(tmp_path, tiny_lm, data, ckpt, monkeypatch, job_uid="uid-again",
                          attempt=0)
    assert code == ExitCode.FINISHED, msg  # not "attempt 0 is superseded: attempt 3 ..."
    assert f"resumed from checkpoint step {STEPS}" in caplog.text
    assert json.loads((ckpt / FENCE).read_text()) == {"attempt": 0, "job_uid": "uid-again"}
    assert msg["export"] == {"path": str(ckpt / "export"), "step": STEPS}
    assert (ckpt / "export" / EXPORT_MARKER).stat().st_mtime_ns == marker  # not redone


def test_a_job_of_another_model_is_refused_naming_both(
        finished: tuple[Path, Path, dict[str, Any]], tiny_vlm: Path, tiny_lm: Path,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    earlier, data, _ = finished
    ckpt = tmp_path / "ckpt"
    shutil.copytree(earlier, ckpt)
    before = {p: p.stat().st_mtime_ns for p in ckpt.rglob("*")}
    code, msg = train(tmp_path, tiny_vlm, data, ckpt, monkeypatch, job_uid="uid-other")
    assert code == ExitCode.CONFIG_ERROR
    assert msg["reason"] == "ConfigError"
    detail = msg["detail"]
    assert detail.startswith("model.path: ") and str(ckpt) in detail
    assert f"checkpoints of model {tiny_lm} (step {STEPS})" in detail
    assert f"this job trains {tiny_vlm}" in detail
    assert str(tiny_vlm) in capsys.readouterr().err
    assert {p: p.stat().st_mtime_ns for p in ckpt.rglob("*")} == before  # nothing touched
