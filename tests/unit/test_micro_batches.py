"""Micro-batches by token budget (grpo_trainer.algorithm.micro_batches): the layout's tokens, the
fewest micro-batches within a budget, and an exact count of them as even as the order of
the samples allows (what every rank must run alike)."""

from __future__ import annotations

import random

import pytest
import torch

from grpo_trainer.algorithm.micro_batches import count_for_budget, layout_tokens, split_evenly
from grpo_trainer.algorithm.samples import EncodedPrompt, Sample
from grpo_trainer.data import Record

pytestmark = pytest.mark.unit


def _groups(shape: list[tuple[int, list[int]]]) -> list[Sample]:
    """Samples of groups given as (prompt tokens, [response tokens, ...]); the samples of
    a group share their encoded prompt, as a rollout leaves them."""
    out = []
    for i, (p, responses) in enumerate(shape):
        prompt = EncodedPrompt(Record(i, "q", "a"), torch.zeros(p, dtype=torch.long))
        out += [Sample(prompt, torch.zeros(r, dtype=torch.long), torch.zeros(r), True)
                for r in responses]
    return out


def test_layout_tokens_are_rows_times_the_widest_row() -> None:
    samples = _groups([(100, [10, 20, 5]), (40, [200])])
    # Shared prefix: rows 100 + 35 and 40 + 200; padded: 4 rows of the longest sample.
    assert layout_tokens(samples, packed=True) == 2 * 240
    assert layout_tokens(samples, packed=False) == 4 * 240
    # A shared-prefix row is as wide as collate_packed pads it: 135 up to 8 x 17.
    assert layout_tokens(samples[:3], packed=True) == 136
    assert layout_tokens([], packed=True) == 0


def test_the_fewest_micro_batches_within_the_budget() -> None:
    samples = _groups([(100, [10, 20, 5]), (40, [200]), (60, [30, 30])])
    assert count_for_budget(samples, 10_000, packed=True) == 1
    # 135 | 240 | 120: each alone; 375 holds the first two rows only as 2 x 240 = 480.
    assert count_for_budget(samples, 240, packed=True) == 3
    assert count_for_budget(samples, 480, packed=True) == 2
    # A sample larger than the budget is a micro-batch of its own, never dropped.
    assert count_for_budget(samples, 50, packed=True) == len(samples)


def _check(samples: list[Sample], parts: int, packed: bool, budget: int | None) -> None:
    cut = split_evenly(samples, parts, packed)
    assert len(cut) == parts and all(cut)
    assert [s for mb in cut for s in mb] == samples  # contiguous, in order
    if budget is not None:
        assert max(layout_tokens(mb, packed) for mb in cut) <= budget


@pytest.mark.parametrize("packed", [True, False], ids=["shared-prefix", "padded"])
def test_an_exact_count_of_micro_batches_none_above_the_budget(packed: bool) -> None:
    """Any count from the budget's own (the most a rank needs) to one sample each; each
    micro-batch within the budget, and the largest never above the budget's greedy cut."""
    rng = random.Random(0)
    for _ in range(200):
        shape = [(rng.randint(5, 300), [rng.randint(1, 200) for _ in range(rng.randint(1, 8))])
                 for _ in range(rng.randint(1, 6))]
        samples = _groups(shape)
        longest = max(layout_tokens([s], packed) for s in samples)
        budget = rng.randint(longest, max(longest, layout_tokens(samples, packed)))
        need = count_for_budget(samples, budget, packed)
        for parts in {need, min(len(samples), need + 1), len(samples)}:
            _check(samples, parts, packed, budget)


def test_the_ranks_common_count_is_cut_evenly() -> None:
    """A rank that needs fewer micro-batches than another cuts its samples into as many,
    as evenly as their order allows: here 4 equal groups into 2, 3 and 4."""
    samples = _groups([(50, [23, 23])] * 4)  # rows of 96 tokens, a multiple of 8
    assert [len(mb) for mb in split_evenly(samples, 2, packed=True)] == [4, 4]
    assert [layout_tokens(mb, True) for mb in split_evenly(samples, 4, packed=True)] == [96] * 4
    three = split_evenly(samples, 3, packed=True)
    assert max(layout_tokens(mb, True) for mb in three) == 192
    with pytest.raises(ValueError, match="cannot cut 8 samples into 9"):
        split_evenly(samples, 9, packed=True)
