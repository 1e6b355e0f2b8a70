"""Validation with ``rollout.engine: vllm`` for real: one engine sharded over both ranks
(TP 2), a val set split unevenly between them (3 + 2 prompts), greedy decoding."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task

pytestmark = pytest.mark.timeout(1800)
VAL_ROWS = 5


def test_validation_with_vllm_tp2_scores_every_val_prompt_once(
    vllm_lm: Path, tmp_path: Path
) -> None:
    train = write_text_task(tmp_path / "train.jsonl")
    val = write_text_task(tmp_path / "val.jsonl", rows=VAL_ROWS, target="3")
    cfg = text_config(
        vllm_lm,
        train,
        rollout={"engine": "vllm", "tensor_parallel_size": 2},
        resources={"num_workers": 2, "cpus_per_worker": 1},
        trainer={"total_steps": 2, "val_interval_steps": 1},
        metrics={"progress_file": str(tmp_path / "progress.json")},
    )
    cfg["data"]["val_files"] = [str(val)]
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GRPO_")}
    proc = subprocess.run(
        [sys.executable, "-m", "grpo_trainer", "--config", str(path)],
        capture_output=True, text=True, env=env, timeout=1500,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith('{"step"')]
    by_step = {m["step"]: m for m in lines}
    assert sorted(by_step) == [0, 1, 2]
    for step in (0, 1, 2):
        assert by_step[step]["val/samples"] == VAL_ROWS, step
        assert 0.0 <= by_step[step]["val/reward_mean"] <= 1.0
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["valStep"] == 2
