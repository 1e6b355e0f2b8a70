"""A checkpoint that truly cannot load under the run's settings ends the run with exit 7
(CheckpointIncompatible) and a message naming the step, the keys and what to do; the
checkpoint is left as it was, and no older one or step 0 is silently trained from.

Produced for real: a LoRA job created again under the same name with another adapter rank
adopts its predecessor's checkpoint claim (docs/troubleshooting.md), so the tiny
Qwen2.5-VL's rank-4 adapters meet a rank-8 run. Before CheckpointIncompatible this was
DCP's "Size mismatch" ValueError, an `Error` the operator retried maxRestarts times.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import ExitCode
from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_vision_task
from grpo_trainer.checkpointing.dcp import DCPCheckpointer, check_sizes, read_tracker, scan
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.run import run_training

pytestmark = pytest.mark.trainer


def _lora(model: Path, data: Path, ckpt: Path, rank: int, steps: int) -> dict[str, Any]:
    return text_config(model, data, actor={"lora": {"rank": rank, "alpha": 2.0 * rank}},
                       checkpoint={"dir": str(ckpt), "interval_steps": 1},
                       trainer={"total_steps": steps})


def test_a_checkpoint_of_other_shapes_exits_7_naming_step_keys_and_advice(
    tiny_vlm: Path, tmp_path: Path, ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_vision_task(tmp_path / "vision.parquet")
    ckpt = tmp_path / "ckpt"
    first = build_config(_lora(tiny_vlm, data, ckpt, 4, 1), environ={})
    trainer = GRPOTrainer(first, checkpointer=DCPCheckpointer(first))
    try:
        trainer.run()
    finally:
        trainer.close()
    before = {p.name: p.read_bytes() for p in (ckpt / "step-1").iterdir()}

    term = tmp_path / "termination-log"
    monkeypatch.setenv("GRPO_TERMINATION_LOG", str(term))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(_lora(tiny_vlm, data, ckpt, 8, 2)))
    assert run_training(str(config)) == ExitCode.CHECKPOINT_INCOMPATIBLE == 7

    msg = json.loads(term.read_text())
    assert msg["reason"] == "CheckpointIncompatible" and msg["step"] is None
    assert msg["lastCheckpointStep"] == 1  # still there, for an attempt that can load it
    detail = msg["detail"]
    assert detail.startswith(f"checkpoint step 1 ({ckpt / 'step-1'}) cannot be loaded with "
                             "this run's settings (actor.precision mixed, LoRA): ")
    assert ".lora_A.weight: the checkpoint has float32[4, " in detail
    assert "this run float32[8, " in detail and "more)" in detail
    assert "the checkpoint is kept" in detail and "grpo-train export" in detail
    # Nothing was trained from step 0 or written over: the directory is as it was.
    assert scan(ckpt) == {1: True} and read_tracker(ckpt).step == 1  # type: ignore[union-attr]
    assert check_sizes(ckpt / "step-1")[1] == []
    assert {p.name: p.read_bytes() for p in (ckpt / "step-1").iterdir()} == before
