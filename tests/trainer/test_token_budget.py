"""Micro-batches by token budget on the update users run: 2 spawned gloo ranks, real
``Worker`` updates of the tiny Qwen2.5-VL (an image in every prompt), the reference and
the old log-probs recomputed, two optimizer steps.

Rank 0's responses are long and rank 1's short, so under the budget rank 0 needs more
micro-batches than rank 1: both must run as many (each forward and backward is a
collective of FSDP2's; one rank running fewer would hang the other), none above the
budget. The loss is still the global token mean: the step's loss, KL, gradient norm and
parameters are those of the same update by micro-batches of 2 samples. Every forward
takes the shared-prefix layout (a group's prompt and image once), and the step reports
the forward tokens per rank and their spread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_testkit import update_check
from grpo_testkit.configs import text_config
from grpo_testkit.datasets import png, write_text_task
from grpo_testkit.dist import run_ranks

pytestmark = pytest.mark.trainer

WORLD = 2
N = 4
# Per rank, two groups of N responses (token ids from 10 up: the image pad is below).
RESPONSES = [
    [[40, 35, 30, 25], [38, 20, 12, 30]],
    [[3, 2, 4, 1], [5, 1, 2, 6]],
]
MAX_PROMPT, MAX_NEW = 128, 40
BUDGET = MAX_PROMPT + MAX_NEW  # the least the config takes: one whole sample


def _items(rank: int) -> list[tuple[dict[str, Any], list[int]]]:
    image = [png((200, 30, 30), (44, 36))]
    out = []
    for g, lengths in enumerate(RESPONSES[rank]):
        record = {"index": 10 * rank + g, "problem": "<image>How many shapes?",
                  "answer": "3", "images": image}
        out += [(record, [10 + (7 * i + j) % 200 for j in range(n)])
                for i, n in enumerate(lengths)]
    return out


def _config(model: Path, data: Path, actor: dict[str, Any]) -> dict[str, Any]:
    raw = text_config(
        model, data,
        rollout={"n": N, "max_new_tokens": MAX_NEW},
        # Two mini-batches: the second is off-policy, so the old log-probs are a pass
        # of their own, as is the reference's.
        actor={"lr": 1e-2, "dtype": "float32", "mini_batch_size": 8, **actor},
        algorithm={"kl_coef": 0.01},
        trainer={"rollout_batch_size": 2 * WORLD},
    )
    raw["data"]["max_prompt_length"] = MAX_PROMPT
    return raw


@pytest.fixture(scope="module")
def updates(tiny_vlm: Path, tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, list[dict[str, Any]]]:
    data = write_text_task(tmp_path_factory.mktemp("budget") / "t.jsonl")
    samples = [_items(r) for r in range(WORLD)]
    advantages = [[(-1.0) ** i * (0.5 + 0.1 * i) for i in range(2 * N)] for _ in range(WORLD)]
    arg = {name: {"config": _config(tiny_vlm, data, actor), "samples": samples,
                  "advantages": advantages}
           for name, actor in (("samples", {"micro_batch_size": 2}),
                               ("tokens", {"micro_batch_tokens": BUDGET}))}
    per_rank = run_ranks(update_check.rank_update, WORLD, arg, timeout_s=600)
    return {name: [r[name] for r in per_rank] for name in arg}


def test_every_rank_runs_as_many_micro_batches_within_the_budget(
    updates: dict[str, list[dict[str, Any]]]
) -> None:
    rank0, rank1 = (r["forwards"] for r in updates["tokens"])
    assert len(rank0) == len(rank1)
    # The budget splits rank 0's long groups; rank 1's would fit in one forward a pass.
    assert len(rank0) > 3 + 2
    for f in rank0 + rank1:
        assert f["tokens"] <= BUDGET
    m0, m1 = (r["metrics"] for r in updates["tokens"])
    assert m0["actor/micro_batches"] == m1["actor/micro_batches"] == 3  # 2 + 1
    assert m0["actor/optimizer_steps"] == 2


def test_the_loss_is_the_global_token_mean_whatever_the_cut(
    updates: dict[str, list[dict[str, Any]]]
) -> None:
    by_samples, by_tokens = updates["samples"][0], updates["tokens"][0]
    for key in ("actor/pg_loss", "actor/kl", "actor/entropy", "actor/grad_norm"):
        assert by_tokens["metrics"][key] == pytest.approx(by_samples["metrics"][key],
                                                          rel=1e-5, abs=1e-7), key
    assert by_tokens["metrics"]["actor/grad_norm"] > 0
    for name, p in by_samples["params"].items():
        # Adam divides by the root of the squared gradient: where a gradient is tiny its
        # rounding (summed over other micro-batches) moves the step; observed 1.8e-6.
        torch.testing.assert_close(by_tokens["params"][name], p, rtol=1e-5, atol=1e-5)


def test_image_groups_take_the_shared_layout_and_ranks_report_their_tokens(
    updates: dict[str, list[dict[str, Any]]]
) -> None:
    for mode in ("samples", "tokens"):
        ranks = updates[mode]
        for r in ranks:
            # One row per group in each forward: the prompt and its image once.
            assert all(f["rows"] == 1 for f in r["forwards"])
        mine = [sum(f["tokens"] for f in r["forwards"]) for r in ranks]
        m = ranks[0]["metrics"]
        assert m["update/forward_tokens"] == sum(mine)
        assert (m["update/rank_tokens_max"], m["update/rank_tokens_min"]) == (max(mine),
                                                                               min(mine))
        assert m["update/rank_tokens_spread"] == pytest.approx((max(mine) - min(mine))
                                                               / max(mine))
