"""How the weight-sync gather buckets parameters: the number of collectives stays about
(model bytes / bucket) at any world size, and no bucket gathers more than its budget.
(The gathered tensors themselves: tests/trainer/test_param_gather.py, on real ranks.)"""

from __future__ import annotations

import math

import pytest

from grpo_trainer.model.param_gather import (
    DEFAULT_BUCKET_BYTES,
    GatherItem,
    gathered_bytes,
    plan_buckets,
)

pytestmark = pytest.mark.unit
BF16 = 2


def qwen25_7b_shapes() -> list[tuple[int, ...]]:
    """Qwen2.5-7B's parameter shapes, in named_parameters order (~7.6e9 parameters)."""
    h, inter, kv, vocab = 3584, 18944, 512, 152064
    layer = [(h, h), (h,), (kv, h), (kv,), (kv, h), (kv,), (h, h),
             (inter, h), (inter, h), (h, inter), (h,), (h,)]
    return [(vocab, h), *(layer * 28), (h,), (vocab, h)]


def _plan(world: int, shapes: list[tuple[int, ...]]) -> list[list[int]]:
    items = [GatherItem(s, "mesh", world) for s in shapes]
    return plan_buckets(items, BF16, DEFAULT_BUCKET_BYTES)


@pytest.mark.parametrize("world", [2, 8, 64, 512])
def test_a_7b_model_takes_a_few_dozen_collectives_at_any_world_size(world: int) -> None:
    shapes = qwen25_7b_shapes()
    full = sum(math.prod(s) for s in shapes) * BF16
    plan = _plan(world, shapes)
    assert [i for b in plan for i in b] == list(range(len(shapes)))  # all, in order, once
    # Filling buckets in order, two neighbours always exceed the budget: at most twice
    # (model bytes / bucket) + 1 collectives (86 here for 15.2 GB), not one per parameter
    # (341) as when the budget counted world x each parameter's full size.
    assert len(plan) <= 2 * math.ceil(full / DEFAULT_BUCKET_BYTES) + 1
    assert len(plan) < len(shapes) / 3
    assert len(plan) <= len(_plan(2, shapes)) + 2  # more ranks: not more collectives
    for bucket in plan:
        gathered = sum(gathered_bytes(shapes[i], world, BF16) for i in bucket)
        assert len(bucket) == 1 or gathered <= DEFAULT_BUCKET_BYTES, (world, bucket)


def test_gathered_bytes_count_the_padding_of_uneven_shards() -> None:
    assert gathered_bytes((10, 4), 4, 2) == 4 * 3 * 4 * 2  # ceil(10/4) = 3 rows per rank
    assert gathered_bytes((8, 4), 4, 2) == 8 * 4 * 2


def test_an_unsharded_parameter_is_gathered_alone_and_splits_the_bucket() -> None:
    items = [GatherItem((4, 4), "m", 2), GatherItem((4,), None), GatherItem((4, 4), "m", 2),
             GatherItem((4, 4), "m", 2), GatherItem((4, 4), "other", 2)]
    assert plan_buckets(items, 4, 1 << 20) == [[0], [1], [2, 3], [4]]
    # A budget of one parameter's gathered bytes: each alone.
    assert plan_buckets(items, 4, 4 * 4 * 4) == [[0], [1], [2], [3], [4]]
