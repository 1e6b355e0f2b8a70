"""Global token-mean: one step on the same batch gives the same loss on 1 and on 2 ranks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_testkit.configs import text_config
from grpo_trainer.config import build_config
from grpo_trainer.data import Record
from grpo_trainer.driver.worker_group import WorkerGroup
from grpo_trainer.rank.worker import Worker
from grpo_trainer.rollout.routing import split

pytestmark = pytest.mark.trainer

# Very different response lengths per rank and per micro-batch: a per-rank or
# per-micro-batch mean would weigh these tokens differently from the global mean.
RESPONSES = [
    [5, 9, 13, 2],
    [7],
    [11, 12, 13, 14, 15, 16, 17, 2],
    [30, 31],
    [40, 41, 42],
    [50],
    [60, 61, 62, 63, 64, 65],
    [70, 71],
]
ADVANTAGES = [1.0, -0.5, 0.8, -1.2, 0.3, -0.7, 1.5, -1.0]
LR = 1e-2


def _one_step(
    model: Path, data: Path, world: int
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    raw = text_config(
        model,
        data,
        resources={"num_workers": world},
        # 2 ranks also take the keep-gathered-until-backward path: same numbers.
        actor={"micro_batch_size": 2, "lr": LR, "reshard_after_forward": world == 1},
        rollout={"n": 2},
        algorithm={"clip_ratio_dual": None},
    )
    cfg = build_config(raw, environ={})
    group = WorkerGroup(cfg)
    try:
        items = [(Record(i // 2, f"question {i // 2}", "7"), r) for i, r in enumerate(RESPONSES)]
        group.call(Worker.load_samples, split(items, world))
        metrics = group.call(Worker.update, split(ADVANTAGES, world), common=[1])[0]
        params = group.call(Worker.full_params)[0]
    finally:
        group.shutdown()
    return metrics, params


def test_one_and_two_ranks_agree(tiny_lm: Path, tmp_path: Path, ray_local: None) -> None:
    from grpo_testkit.datasets import write_text_task

    data = write_text_task(tmp_path / "t.jsonl")
    m1, p1 = _one_step(tiny_lm, data, 1)
    m2, p2 = _one_step(tiny_lm, data, 2)
    assert m1["actor/pg_loss"] == pytest.approx(m2["actor/pg_loss"], rel=1e-5, abs=1e-7)
    assert m1["actor/grad_norm"] == pytest.approx(m2["actor/grad_norm"], rel=1e-4)
    assert m1["actor/grad_norm"] > 0
    # Adam's first step moves an element by lr * g / (|g| + eps): where |g| is near eps, the
    # two layouts' summation orders (which differ with the CPU's kernels, AVX2 or AVX-512)
    # show in the parameter, 1.7e-6 = 1.7e-4 of lr measured on an AVX2 EPYC. The bound is
    # 1e-3 of lr; a wrong aggregation flips whole steps (2 * lr) and fails the losses above.
    for name in p1:
        torch.testing.assert_close(p1[name], p2[name], rtol=1e-5, atol=1e-3 * LR)
