"""Groups exchanged between ranks before the update (actor.balance_ranks), through the
driver's own step code on 2 real Ray ranks: rank 0 generated long responses and rank 1
short ones; after the exchange their update tokens are close, and the update is the
same one (the loss is the global token mean, whichever rank trains a group)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_trainer.config import build_config
from grpo_trainer.data import Record
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.driver.worker_group import WorkerGroup
from grpo_trainer.rank.worker import Worker

pytestmark = pytest.mark.trainer

N = 4
# Per rank two groups of N responses: rank 0's long, rank 1's short.
LENGTHS = [[[30, 28, 26, 24], [29, 27, 25, 23]], [[3, 2, 4, 1], [5, 1, 2, 6]]]
ADVANTAGES = [(-1.0) ** i * (0.3 + 0.05 * i) for i in range(4 * N)]


def _step(model: Path, data: Path, balance: bool) -> tuple[dict[str, float], int, Any]:
    cfg = build_config(text_config(
        model, data, rollout={"n": N, "max_new_tokens": 32},
        actor={"micro_batch_size": 2, "lr": 1e-2, "balance_ranks": balance},
        trainer={"rollout_batch_size": 4},
    ), environ={})
    trainer = GRPOTrainer(cfg)
    trainer.group = WorkerGroup(cfg)
    try:
        items = [[(Record(2 * r + g, f"question {2 * r + g}", "7"),
                   [10 + (i + j) % 50 for j in range(n)])
                  for g, lengths in enumerate(LENGTHS[r]) for i, n in enumerate(lengths)]
                 for r in range(2)]
        outs = trainer.group.call(Worker.load_samples, items)
        advantages, moved = trainer._balance(outs, ADVANTAGES)
        metrics = trainer.group.call(Worker.update, advantages, common=[1])[0]
        params = trainer.group.call(Worker.full_params)[0]
    finally:
        trainer.group.shutdown()
    return metrics, moved, params


def test_exchanged_groups_even_out_the_ranks_and_leave_the_update_as_it_was(
    tiny_lm: Path, tmp_path: Path, ray_local: None
) -> None:
    data = write_text_task(tmp_path / "t.jsonl")
    kept, moved_none, p_kept = _step(tiny_lm, data, balance=False)
    even, moved, p_even = _step(tiny_lm, data, balance=True)
    assert moved_none == 0 and moved == 2  # one group each way
    spread = (kept["update/rank_tokens_spread"], even["update/rank_tokens_spread"])
    assert spread[0] > 0.4 and spread[1] < 0.1, spread
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert even[key] == pytest.approx(kept[key], rel=1e-5, abs=1e-7), key
    for name, p in p_kept.items():
        torch.testing.assert_close(p_even[name], p, rtol=1e-5, atol=1e-5)
