"""Validation on a held-out split: greedy decoding in the rollout engine, val metrics and
progress at the scheduled steps, and a training trajectory that does not notice it."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_trainer.algorithm.samples import PromptEncoder
from grpo_trainer.config import build_config
from grpo_trainer.data import Record, load_template
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.driver.metrics import MetricsLogger
from grpo_trainer.liveness.progress import JsonFileProgressReporter
from grpo_trainer.rank.worker import Worker
from grpo_trainer.rollout.base import SamplingSpec
from grpo_trainer.rollout.hf import HFGenerateEngine

pytestmark = pytest.mark.trainer

VOLATILE = ("time/", "throughput/", "memory/")
VAL_ROWS = 5  # uneven over 2 ranks: 3 + 2


def _train(raw: dict[str, Any], progress: Path) -> tuple[dict[int, dict[str, Any]], Any]:
    """Run to the end: the metric lines by step, and rank 0's full parameters."""
    cfg = build_config(raw, environ={})
    out = io.StringIO()
    trainer = GRPOTrainer(
        cfg,
        reporter=JsonFileProgressReporter(progress, 0.0),
        metrics=MetricsLogger(cfg.metrics, cfg.trainer.total_steps or 0, stream=out),
    )
    try:
        trainer.run()
        assert trainer.group is not None
        params = trainer.group.call(Worker.full_params)[0]
    finally:
        trainer.close()
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    return {m["step"]: m for m in lines}, params


def test_validation_reports_at_its_steps_and_leaves_training_bit_identical(
    tiny_lm: Path, tmp_path: Path, ray_local: None
) -> None:
    train = write_text_task(tmp_path / "train.jsonl")
    val = write_text_task(tmp_path / "val.jsonl", rows=VAL_ROWS, target="3")
    base = text_config(tiny_lm, train, trainer={"total_steps": 3})
    off, off_params = _train(base, tmp_path / "off.json")
    with_val = text_config(tiny_lm, train, trainer={"total_steps": 3, "val_interval_steps": 2})
    with_val["data"]["val_files"] = [str(val)]
    on, on_params = _train(with_val, tmp_path / "on.json")

    # Before training (a fresh start), every 2 steps, and after the last step.
    assert sorted(on) == [0, 1, 2, 3]
    assert {s for s, m in on.items() if "val/reward_mean" in m} == {0, 2, 3}
    assert set(on[0]) == {"step", "time/val_s"} | {k for k in on[0] if k.startswith("val/")}
    for step in (0, 2, 3):
        assert on[step]["val/samples"] == VAL_ROWS  # every val prompt scored exactly once
        assert 0.0 <= on[step]["val/reward_mean"] <= 1.0
        assert "val/accuracy" in on[step]  # mentions_answer reports one
    progress = json.loads((tmp_path / "on.json").read_text())
    assert progress["valStep"] == 3 and progress["valRewardMean"] == on[3]["val/reward_mean"]
    assert "valStep" not in json.loads((tmp_path / "off.json").read_text())

    # Training never noticed: the same metrics every step and the same weights, bit for bit.
    def training(m: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in m.items() if not k.startswith((*VOLATILE, "val/"))}

    assert sorted(off) == [1, 2, 3]
    for step in (1, 2, 3):
        assert training(on[step]) == training(off[step]), step
    assert on_params.keys() == off_params.keys()
    for name in on_params:
        assert torch.equal(on_params[name], off_params[name]), name
    # The update reports each stage of the update on its own.
    assert {"time/old_logprob_s", "time/ref_logprob_s", "time/update_s"} <= on[1].keys()


def test_greedy_decoding_is_the_argmax_in_both_samplers_whatever_the_seed(tiny_lm: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    enc = PromptEncoder(None, tok, load_template("plain"), None)
    prompts = [enc.encode(Record(i, f"Say the number 7 please {i}", "7")) for i in range(3)]
    eos = [model.config.eos_token_id]

    def greedy(sampler: str, seed: int) -> list[torch.Tensor]:
        engine = HFGenerateEngine(model, tok.pad_token_id, eos, sampler)
        spec = SamplingSpec(n=1, temperature=0.0, top_p=1.0, max_new_tokens=8, seed=seed)
        return [group[0].token_ids for group in engine.generate(prompts, spec)]

    native = greedy("native", 1)
    for other in (greedy("native", 2), greedy("generate", 3)):
        for a, b in zip(native, other, strict=True):
            assert torch.equal(a, b)
    # The first token is the argmax of the model's own next-token logits.
    ids = prompts[0].input_ids[None]
    with torch.no_grad():
        first = model(input_ids=ids).logits[0, -1].argmax()
    assert int(native[0][0]) == int(first)


def test_val_reward_rises_as_the_policy_learns(
    tiny_lm: Path, tmp_path: Path, ray_local: None
) -> None:
    train = write_text_task(tmp_path / "train.jsonl")
    val = write_text_task(tmp_path / "val.jsonl", rows=VAL_ROWS)  # the learnable target, 7
    raw = text_config(tiny_lm, train, trainer={"total_steps": 12, "val_interval_steps": 12})
    raw["data"]["val_files"] = [str(val)]
    history, _ = _train(raw, tmp_path / "progress.json")
    assert {s for s, m in history.items() if "val/reward_mean" in m} == {0, 12}
    before, after = history[0]["val/reward_mean"], history[12]["val/reward_mean"]
    assert after > before + 0.3, (before, after)
