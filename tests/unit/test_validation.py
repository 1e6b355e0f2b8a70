"""Validation's pure parts: which steps validate, the val set split over ranks (every
prompt answered exactly once), and the metrics of a pass."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_trainer.data import Record
from grpo_trainer.driver.validation import ValSchedule, gather, rank_chunks, shares, summarize
from grpo_trainer.rewards import RewardResult

pytestmark = pytest.mark.unit


def records(n: int) -> list[Record]:
    return [Record(index=i, problem=f"p{i}", answer=str(i)) for i in range(n)]


def test_schedule_every_n_steps_the_last_step_and_a_fresh_start() -> None:
    sched = ValSchedule(interval=4, before_train=True, total_steps=10)
    assert [s for s in range(11) if sched.due(s)] == [0, 4, 8, 10]
    no_baseline = ValSchedule(interval=4, before_train=False, total_steps=10)
    assert [s for s in range(11) if no_baseline.due(s)] == [4, 8, 10]
    assert not any(ValSchedule(0, True, 10).due(s) for s in range(11))


@pytest.mark.parametrize(("count", "world"), [(7, 2), (10, 3), (2, 4), (0, 2), (9, 1)])
def test_shares_are_disjoint_cover_everything_and_differ_by_at_most_one(
    count: int, world: int
) -> None:
    parts = shares(count, world)
    assert len(parts) == world
    flat = [i for r in parts for i in r]
    assert sorted(flat) == list(range(count)) and len(set(flat)) == count
    sizes = [len(r) for r in parts]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(
    ("count", "world", "chunk"), [(11, 2, 4), (7, 3, 2), (3, 4, 8), (16, 2, 8)]
)
def test_every_rank_gets_the_same_number_of_chunks_and_each_prompt_once(
    count: int, world: int, chunk: int
) -> None:
    plan = rank_chunks(records(count), world, chunk)
    assert len(plan) == world
    assert len({len(chunks) for chunks in plan}) == 1  # TP groups call the engine together
    assert all(len(c) <= chunk for chunks in plan for c in chunks)
    seen = [r.index for chunks in plan for c in chunks for r in c]
    assert sorted(seen) == list(range(count)) and len(seen) == count


def answered(plan: list[list[list[Record]]]) -> list[list[dict[str, Any]]]:
    """What each rank's generate_greedy returns for its chunks."""
    return [[{"index": r.index, "text": r.answer} for c in chunks for r in c] for chunks in plan]


def test_gather_puts_every_ranks_answers_in_val_set_order() -> None:
    val = records(11)
    out = gather(answered(rank_chunks(val, 3, 2)), val)
    assert [o["index"] for o in out] == list(range(11))


def test_gather_refuses_a_lost_or_doubled_prompt() -> None:
    val = records(5)
    outs = answered(rank_chunks(val, 2, 2))
    with pytest.raises(RuntimeError, match=r"missing \[4\]"):
        gather([outs[0], outs[1][:-1]], val)
    with pytest.raises(RuntimeError, match=r"doubled \[0\]"):
        gather([outs[0], [*outs[1], outs[0][0]]], val)


def test_summary_reports_accuracy_only_when_the_reward_gives_one() -> None:
    with_acc = summarize(
        [RewardResult(1.0, 1.0), RewardResult(0.5, 0.0), RewardResult(0.0, None, "boom")],
        [4, 6, 8],
    )
    assert with_acc == {
        "val/reward_mean": 0.5,
        "val/samples": 3.0,
        "val/reward_failed": 1.0,
        "val/response_length_mean": 6.0,
        "val/accuracy": 0.5,
    }
    assert "val/accuracy" not in summarize([RewardResult(0.25, None)], [3])
