"""``actor.precision: bf16`` with the transformers engine: the tiny text and VLM tasks
learn with bf16 parameters, gradients and optimizer state, and a SIGKILLed bf16 run
resumes to bit-identical weights (the Kahan compensation is in the checkpoint)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from grpo_testkit.configs import text_config
from grpo_testkit.crash import CrashServer, crash_run_config, step_metrics
from grpo_testkit.datasets import write_text_task, write_vision_task
from grpo_trainer.checkpointing import make_checkpointer
from grpo_trainer.checkpointing.dcp import committed_step
from grpo_trainer.checkpointing.export import load_model_tensors
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.rank.worker import Worker

pytestmark = pytest.mark.trainer

BF16 = {"precision": "bf16"}


def _train(raw: dict[str, Any]) -> tuple[list[dict[str, float]], list[float]]:
    cfg = build_config(raw, environ={})
    trainer = GRPOTrainer(cfg, checkpointer=make_checkpointer(cfg, resume=False))
    try:
        history = trainer.run()
        assert trainer.group is not None
        gaps = trainer.group.call(Worker.rollout_log_prob_gap)
    finally:
        trainer.close()
    return history, gaps


def _assert_stored_in_bf16(ckpt: Path, step: int) -> None:
    """The final checkpoint's weights are bf16: the parameters really were stored so."""
    tensors = load_model_tensors(ckpt / f"step-{step}")
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}


def _rise(history: list[dict[str, float]], k: int) -> tuple[float, float]:
    rewards = [m["reward/mean"] for m in history]
    return sum(rewards[:k]) / k, sum(rewards[-k:]) / k


@pytest.mark.parametrize("strategy", ["rank0", "sharded", "naive"])
def test_every_init_strategy_stores_the_checkpoint_in_bf16_and_rotary_in_fp32(
    tiny_vlm: Path, tmp_path: Path, strategy: str
) -> None:
    from grpo_api.trainer_config import ModelConfig
    from grpo_testkit.crash import LocalGroup
    from grpo_trainer.model.modeling import load_full

    data = write_vision_task(tmp_path / "vision.parquet")
    raw = text_config(
        tiny_vlm, data, actor={**BF16, "init_strategy": strategy}, resources={"num_workers": 1}
    )
    group = LocalGroup(build_config(raw, environ={}))
    try:
        actor = group.workers[0].state.actor
        params = {n: p.detach().full_tensor() for n, p in actor.named_parameters()}
        buffers = {n: b.detach() for n, b in actor.named_buffers()}
    finally:
        group.shutdown()
    ref = load_full(ModelConfig(path=str(tiny_vlm)), torch.float32)
    for name, want in ref.named_parameters():
        assert params[name].dtype == torch.bfloat16, name
        assert torch.equal(params[name], want.detach().bfloat16()), name
    rotary = [n for n in buffers if n.endswith("inv_freq")]
    assert rotary and all(buffers[n].dtype == torch.float32 for n in rotary)
    for name, want in ref.named_buffers():
        assert torch.equal(buffers[name], want), name


def test_text_task_learns_in_bf16(tiny_lm: Path, tmp_path: Path, ray_local: None) -> None:
    data = write_text_task(tmp_path / "text.jsonl")
    ckpt = {"dir": str(tmp_path / "ckpt"), "interval_steps": 16}
    raw = text_config(tiny_lm, data, trainer={"total_steps": 16}, actor=BF16, checkpoint=ckpt)
    history, gaps = _train(raw)
    _assert_stored_in_bf16(tmp_path / "ckpt", 16)
    start, end = _rise(history, 4)
    assert end > start + 0.15, [m["reward/mean"] for m in history]
    # The engine got the bf16 weights each step (widened to the float32 compute dtype
    # on both sides), so its log-probs are the actor's.
    assert max(gaps) < 1e-3
    assert all(m["rollout/logprob_abs_diff_mean"] < 1e-4 for m in history)


def test_vlm_task_learns_in_bf16(tiny_vlm: Path, tmp_path: Path, ray_local: None) -> None:
    data = write_vision_task(tmp_path / "vision.parquet")
    # The tiny VLM learns the task more slowly than the text model, in either precision
    # (bench/bench_bf16.py: mixed 0.02 -> 0.28, bf16 0.02 -> 0.30 over 16 steps).
    ckpt = {"dir": str(tmp_path / "ckpt"), "interval_steps": 16}
    raw = text_config(tiny_vlm, data, trainer={"total_steps": 16}, actor=BF16, checkpoint=ckpt)
    history, _ = _train(raw)
    _assert_stored_in_bf16(tmp_path / "ckpt", 16)
    start, end = _rise(history, 4)
    assert end > start + 0.15, [m["reward/mean"] for m in history]


@pytest.fixture(scope="module")
def server() -> Iterator[CrashServer]:
    s = CrashServer()
    yield s
    s.close()


def test_bf16_run_killed_with_sigkill_resumes_bit_identically(
    server: CrashServer, tiny_lm: Path, tmp_path: Path
) -> None:
    steps = 4
    data = write_text_task(tmp_path / "t.jsonl")

    def config(name: str) -> Path:
        return crash_run_config(tmp_path, tiny_lm, data, name, steps=steps, keep=4, actor=BF16)

    server.start(config("ref"), tmp_path / "ref.log")
    assert server.wait() == 0, (tmp_path / "ref.log").read_text()[-3000:]
    ref = step_metrics(tmp_path / "ref.log")
    assert sorted(ref) == list(range(1, steps + 1))

    # Killed once step 2 is committed: the resume must restore the optimizer's bf16
    # moments and compensation exactly, or step 3 onwards drifts from the reference.
    cfg = config("killed")
    server.start(cfg, tmp_path / "killed.log")
    deadline = time.monotonic() + 300
    while (committed_step(tmp_path / "killed") or 0) < 2:
        assert server.poll() is None, (tmp_path / "killed.log").read_text()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert server.kill() and server.wait() == -9
    server.start(cfg, tmp_path / "resumed.log")
    assert server.wait() == 0, (tmp_path / "resumed.log").read_text()[-3000:]
    log = (tmp_path / "resumed.log").read_text()
    assert "resumed from checkpoint step" in log, log[-3000:]
    for step, m in step_metrics(tmp_path / "resumed.log").items():
        assert m == ref[step], f"step {step} differs after the resume"

    last = f"step-{steps}"
    ours = load_model_tensors(tmp_path / "killed" / last)
    theirs = load_model_tensors(tmp_path / "ref" / last)
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    # The weights are stored in bf16, and they did move from the initial ones.
    assert {t.dtype for t in ours.values()} == {torch.bfloat16}
    first = load_model_tensors(tmp_path / "ref" / "step-1")
    assert any(not torch.equal(ours[k], first[k]) for k in ours)
    # The optimizer's state in the checkpoint: both moments and the compensation, bf16.
    meta = FileSystemReader(str(tmp_path / "killed" / last)).read_metadata()
    optim = {
        k.rsplit(".", 1)[-1]: md.properties.dtype
        for k, md in meta.state_dict_metadata.items()
        if k.startswith("optim.state.") and isinstance(md, TensorStorageMetadata) and md.size
    }
    assert optim == dict.fromkeys(("exp_avg", "exp_avg_sq", "compensation"), torch.bfloat16)
