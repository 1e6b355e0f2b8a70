"""Exit-code contract: bad config -> 2 naming the field, CUDA OOM -> 3, lost worker -> 5."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_api.contract import ExitCode
from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_trainer.run import run_training

pytestmark = pytest.mark.trainer


def _write(tmp_path: Path, cfg: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda c: c["actor"].update(learning_rate=1e-3), "actor.learning_rate"),
        (
            lambda c: c["data"].update(train_files=["/nonexistent/train.parquet"]),
            "data.train_files[0]",
        ),
        (lambda c: c["trainer"].update(rollout_batch_size=3), "trainer.rollout_batch_size"),
    ],
    ids=["unknown-field", "missing-data-file", "batch-not-divisible"],
)
def test_bad_config_exits_2_naming_the_field(
    tiny_lm: Path, tmp_path: Path, mutate: object, field: str
) -> None:
    data = write_text_task(tmp_path / "t.jsonl")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    cfg = text_config(tiny_lm, data, checkpoint={"dir": str(ckpt), "interval_steps": 1})
    mutate(cfg)  # type: ignore[operator]
    term = tmp_path / "termination-log"
    env = {**os.environ, "GRPO_TERMINATION_LOG": str(term)}
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_trainer", "--config", str(_write(tmp_path, cfg))],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == ExitCode.CONFIG_ERROR, proc.stderr
    assert field in proc.stderr
    assert json.loads(term.read_text())["reason"] == "ConfigError"
    assert field in json.loads(term.read_text())["detail"]
    assert list(ckpt.iterdir()) == []


def test_injected_cuda_oom_in_a_worker_exits_3_with_the_step(
    tiny_lm: Path, tmp_path: Path, ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_text_task(tmp_path / "t.jsonl")
    term = tmp_path / "termination-log"
    monkeypatch.setenv("GRPO_FAULT_INJECT", "cuda_oom@step=2")
    monkeypatch.setenv("GRPO_TERMINATION_LOG", str(term))
    cfg = text_config(tiny_lm, data, trainer={"total_steps": 3})
    code = run_training(str(_write(tmp_path, cfg)))
    assert code == ExitCode.CUDA_OOM
    msg = json.loads(term.read_text())
    assert msg["reason"] == "CudaOOM" and msg["step"] == 2
    assert "INJECTED FAULT" in msg["detail"] and "lastCheckpointStep" in msg
    # Raised in the rank's update, and tagged there: it crossed Ray's pickling to the driver.
    assert msg["stage"] == "training"


def test_lost_worker_exits_5(
    tiny_lm: Path, tmp_path: Path, ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_text_task(tmp_path / "t.jsonl")
    term = tmp_path / "termination-log"
    monkeypatch.setenv("GRPO_FAULT_INJECT", "worker_exit@step=1")
    monkeypatch.setenv("GRPO_TERMINATION_LOG", str(term))
    cfg = text_config(tiny_lm, data, resources={"num_workers": 1})
    code = run_training(str(_write(tmp_path, cfg)))
    assert code == ExitCode.WORKER_LOST
    msg = json.loads(term.read_text())
    assert msg["reason"] == "NodeLost" and msg["step"] == 1
