"""End to end on a text task: the policy learns, log-probs agree, metrics reach every sink."""

from __future__ import annotations

import json
import socket
import urllib.request
from pathlib import Path

import pytest

from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.liveness.progress import JsonFileProgressReporter
from grpo_trainer.rank.worker import Worker

pytestmark = pytest.mark.trainer


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_reward_rises_on_a_learnable_task(
    tiny_lm: Path, tmp_path: Path, ray_local: None, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_text_task(tmp_path / "text.jsonl")
    port = _free_port()
    raw = text_config(
        tiny_lm,
        data,
        trainer={"total_steps": 16},
        metrics={
            "tensorboard_dir": str(tmp_path / "tb"),
            "prometheus_port": port,
            "progress_file": str(tmp_path / "progress.json"),
        },
    )
    cfg = build_config(raw, environ={})
    assert cfg.metrics.progress_file is not None
    trainer = GRPOTrainer(cfg, reporter=JsonFileProgressReporter(cfg.metrics.progress_file, 0.0))
    try:
        history = trainer.run()
        assert trainer.group is not None
        gaps = trainer.group.call(Worker.rollout_log_prob_gap)
        scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    finally:
        trainer.close()

    rewards = [m["reward/mean"] for m in history]
    start, end = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert end > start + 0.15, f"reward did not rise: {rewards}"
    # The rollout engine's log-probs are the actor's for the same tokens (fp32 here).
    assert max(gaps) < 1e-3
    assert all(m["rollout/logprob_abs_diff_mean"] < 1e-4 for m in history)

    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
    assert [x["step"] for x in lines] == list(range(1, 17))
    for key in (
        "reward/std",
        "actor/kl",
        "actor/clip_frac",
        "actor/entropy",
        "response/length_mean",
        "time/step_s",
        "throughput/tokens_per_s",
    ):
        assert key in lines[-1]
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert "grpo_reward_mean" in scraped
    progress = json.loads((tmp_path / "progress.json").read_text())
    assert progress["step"] == 16 and progress["totalSteps"] == 16
