"""Resume on real Ray with 2 FSDP ranks: exact continuation, resharding, damage, export.

One uninterrupted 4-step run is the reference. A fresh trainer (new actors, new
driver objects) given only its step-2 checkpoint must print the same metrics for
steps 3-4 and end with bit-identical weights (test_checkpoint_crash.py does the
same through real SIGKILLs on one rank). A copy of the reference's checkpoints,
with the newest truncated and a half-written directory beside it, then resumes
on ONE rank and is exported.
"""

from __future__ import annotations

import io
import json
import logging
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from click.testing import CliRunner

from grpo_api.trainer_config import Config
from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_trainer.checkpointing.dcp import DCPCheckpointer, read_tracker, scan
from grpo_trainer.checkpointing.export import load_model_tensors
from grpo_trainer.checkpointing.files import atomic_write
from grpo_trainer.checkpointing.tracker import Tracker
from grpo_trainer.cli import cli
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.driver.metrics import MetricsLogger
from grpo_trainer.rank.worker import Worker

pytestmark = pytest.mark.trainer

VOLATILE = ("time/", "throughput/", "memory/")


def _cfg(model: Path, data: Path, ckpt: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    base: dict[str, dict[str, Any]] = {
        "checkpoint": {"dir": str(ckpt), "interval_steps": 2, "keep": 2},
        "trainer": {"total_steps": 4},
    }
    for key, value in sections.items():
        base[key] = {**base.get(key, {}), **value}
    return text_config(model, data, **base)


def _train(cfg: Config) -> tuple[GRPOTrainer, dict[int, dict[str, Any]]]:
    """Run to the end; the JSON metric lines it printed, by step, timings left out."""
    out = io.StringIO()
    trainer = GRPOTrainer(
        cfg,
        checkpointer=DCPCheckpointer(cfg),
        metrics=MetricsLogger(cfg.metrics, cfg.trainer.total_steps, stream=out),
    )
    try:
        trainer.run()
    finally:
        trainer.close()
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    return trainer, {
        m["step"]: {k: v for k, v in m.items() if not k.startswith(VOLATILE)} for m in lines
    }


@dataclass
class Reference:
    model: Path
    data: Path
    ckpt: Path
    metrics: dict[int, dict[str, Any]]


@pytest.fixture(scope="module")
def reference(
    tiny_lm: Path, tmp_path_factory: pytest.TempPathFactory, ray_local: None
) -> Reference:
    tmp = tmp_path_factory.mktemp("reference")
    data = write_text_task(tmp / "t.jsonl")
    # Async saves: the background writer's collectives run beside the training's.
    raw = _cfg(tiny_lm, data, tmp / "ckpt", checkpoint={"async_save": True})
    _, metrics = _train(build_config(raw, environ={}))
    return Reference(tiny_lm, data, tmp / "ckpt", metrics)


def _same_weights(a: Path, b: Path) -> None:
    ta, tb = load_model_tensors(a), load_model_tensors(b)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


def test_resume_from_the_middle_continues_exactly(reference: Reference, tmp_path: Path) -> None:
    # What a run that died during step 3 leaves behind: step 2, committed.
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copytree(reference.ckpt / "step-2", ckpt / "step-2")
    atomic_write(ckpt / "latest", Tracker(step=2, dir="step-2").model_dump_json().encode())

    resumed, metrics = _train(build_config(_cfg(reference.model, reference.data, ckpt), environ={}))
    assert sorted(metrics) == [3, 4]  # it did not start again at step 1
    for step in (3, 4):
        assert metrics[step] == reference.metrics[step], step
    _same_weights(ckpt / "step-4", reference.ckpt / "step-4")
    assert resumed.checkpointer.latest_step() == 4


def test_resume_on_one_rank_skips_damage_and_exports(
    reference: Reference, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference.ckpt, ckpt)
    assert read_tracker(ckpt) is not None and read_tracker(ckpt).step == 4  # type: ignore[union-attr]
    # The newest checkpoint loses the end of one shard; a save that never finished
    # left a directory without its marker.
    shard = ckpt / "step-4" / "__1_0.distcp"
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 100)
    (ckpt / "step-5").mkdir()
    (ckpt / "step-5" / "__0_0.distcp").write_bytes(b"partial")

    cfg = build_config(
        _cfg(
            reference.model,
            reference.data,
            ckpt,
            resources={"num_workers": 1},
            trainer={"total_steps": 3},
        ),
        environ={},
    )
    caplog.set_level(logging.INFO, logger="grpo_trainer")
    trainer = GRPOTrainer(cfg, checkpointer=DCPCheckpointer(cfg))
    try:
        trainer.start()
        assert trainer.step == 2
        assert trainer.group is not None
        params = trainer.group.call(Worker.full_params)[0]
        history = trainer.run()
    finally:
        trainer.close()
    log = caplog.text
    assert f"removing checkpoint directory {ckpt / 'step-5'}" in log
    assert f"checkpoint {ckpt / 'step-4'} is corrupt" in log and "__1_0.distcp" in log
    assert "resumed from checkpoint step 2" in log and "resharded 2 -> 1 ranks" in log

    # One rank now holds what two ranks saved, bit for bit.
    saved = load_model_tensors(ckpt / "step-2")
    assert params.keys() <= saved.keys()
    for k, v in params.items():
        assert torch.equal(v, saved[k]), k
    assert [m for m in history] and all(
        math.isfinite(m[k]) for m in history for k in ("actor/pg_loss", "actor/grad_norm")
    )
    # Step 3 committed; the skipped step 4 was another timeline and is gone.
    assert scan(ckpt) == {2: True, 3: True}
    assert read_tracker(ckpt).step == 3  # type: ignore[union-attr]

    out = tmp_path / "hf"
    res = CliRunner().invoke(
        cli, ["export", "--checkpoint-dir", str(ckpt), "--out", str(out), "--dtype", "float32"]
    )
    assert res.exit_code == 0, res.output
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert tok("the answer is 7")["input_ids"]
    exported = model.state_dict()
    final = load_model_tensors(ckpt / "step-3")
    assert final.keys() <= exported.keys()
    for k, v in final.items():
        assert torch.equal(exported[k], v), k
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
