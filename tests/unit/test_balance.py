"""Groups exchanged between ranks so that their update tokens are about equal
(grpo_trainer.algorithm.balance): every rank keeps its number of groups, every group trains once,
the most loaded rank never gets heavier, few groups move; and a group handed over keeps
one shared prompt (one row of the shared-prefix layout) through pickling."""

from __future__ import annotations

import pickle
import random

import pytest
import torch

from grpo_trainer.algorithm.balance import Plan, balance, hand_over
from grpo_trainer.algorithm.samples import EncodedPrompt, Sample
from grpo_trainer.data import Record

pytestmark = pytest.mark.unit


def _loads(plan: Plan, costs: list[list[int]]) -> list[int]:
    return [sum(costs[r][g] for r, g in mine) for mine in plan.ranks]


def _check(plan: Plan, costs: list[list[int]]) -> None:
    assert [len(m) for m in plan.ranks] == [len(c) for c in costs]
    every = sorted(grp for mine in plan.ranks for grp in mine)
    assert every == [(r, g) for r, c in enumerate(costs) for g in range(len(c))]
    assert max(_loads(plan, costs)) <= max(sum(c) for c in costs)
    for r, mine in enumerate(plan.ranks):
        own = [g for src, g in mine if src == r]
        assert mine[: len(own)] == [(r, g) for g in own] and own == sorted(own)
        assert plan.leaving(r) == sorted(set(range(len(costs[r]))) - set(own))


def test_long_responses_on_one_rank_are_spread_over_both() -> None:
    costs = [[900, 850, 800, 700], [120, 100, 90, 80]]
    plan = balance(costs)
    _check(plan, costs)
    before, after = [sum(c) for c in costs], _loads(plan, costs)
    assert max(before) - min(before) == 2860
    assert max(after) - min(after) <= 100  # from 2860 tokens apart to within one swap
    assert 0 < plan.moved <= 4


def test_an_even_split_moves_nothing() -> None:
    costs = [[300, 200], [250, 250]]
    plan = balance(costs)
    assert plan.moved == 0 and plan.ranks == [[(0, 0), (0, 1)], [(1, 0), (1, 1)]]


def test_random_loads_never_get_worse() -> None:
    rng = random.Random(0)
    for _ in range(300):
        world, groups = rng.randint(1, 6), rng.randint(1, 6)
        costs = [[rng.randint(10, 2000) for _ in range(groups)] for _ in range(world)]
        plan = balance(costs)
        _check(plan, costs)
        if plan.moved:
            before, after = [sum(c) for c in costs], _loads(plan, costs)
            assert max(after) - min(after) < max(before) - min(before)


def test_a_group_handed_over_keeps_one_prompt_without_its_images() -> None:
    def group(i: int, n: int) -> list[Sample]:
        prompt = EncodedPrompt(Record(i, "q", "a"), torch.arange(5), images=["a picture"])
        return [Sample(prompt, torch.arange(k + 1), torch.zeros(k + 1), True)
                for k in range(n)]

    samples = group(0, 3) + group(1, 3) + group(2, 3)
    kept, leaving = hand_over(samples, [1], 3)
    assert kept == samples[:3] + samples[6:]
    (moved,) = pickle.loads(pickle.dumps(leaving))
    assert [s.response_ids.numel() for s in moved] == [1, 2, 3]
    assert all(s.prompt is moved[0].prompt for s in moved)  # one row when packed
    assert moved[0].prompt.images == [] and kept[0].prompt.images == ["a picture"]
