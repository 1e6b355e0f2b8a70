"""The disaggregated rollout's pure decisions: which batches may be in flight, which
engine's groups each rank trains, the weight sync's backend and buckets, the Ray labels
each side is placed by, and the configs refused with the config."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from grpo_api.contract import RAY_SIDE_LABEL, RAY_SIDE_ROLLOUT, RAY_SIDE_TRAIN
from grpo_api.trainer_config import Config
from grpo_trainer.cluster.devices import weight_sync_backend
from grpo_trainer.cluster.placement import exclusion_selector, side_labels
from grpo_trainer.rollout.routing import launch_through, route
from grpo_trainer.rollout.weight_bus import buckets

pytestmark = pytest.mark.unit


def _cfg(**rollout: Any) -> Config:
    raw: dict[str, Any] = {
        "model": {"path": "m"}, "data": {"train_files": ["d.jsonl"]},
        "resources": {"num_workers": 2},
        "trainer": {"rollout_batch_size": 4},
        "rollout": {"placement": "disaggregated", "disaggregated": {"engines_per_node": 2},
                    **rollout},
    }
    return Config.model_validate(raw)


def test_staleness_bounds_how_far_the_engines_run_ahead() -> None:
    # Policy 0 (nothing trained) may generate step 1 only at staleness 0 (the colocated
    # order), steps 1-2 at staleness 1; never past the run's last step.
    assert launch_through(0, 0, 10) == 1
    assert launch_through(0, 1, 10) == 2
    assert launch_through(4, 2, 10) == 7
    assert launch_through(9, 3, 10) == 10


def test_as_many_engines_as_ranks_route_each_engine_to_its_rank() -> None:
    assert route([2, 2], 2) == [[(0, 0, 2)], [(1, 0, 2)]]


def test_fewer_engines_than_ranks_split_an_engines_groups() -> None:
    # One engine drew all 4 groups: rank 0 trains its first two, rank 1 the others.
    assert route([4], 2) == [[(0, 0, 2)], [(0, 2, 4)]]
    # Three engines of 2 groups over 2 ranks: engine 1's groups are cut between them.
    assert route([2, 2, 2], 2) == [[(0, 0, 2), (1, 0, 1)], [(1, 1, 2), (2, 0, 2)]]
    with pytest.raises(ValueError, match="evenly"):
        route([3], 2)


def test_the_weight_group_is_nccl_only_with_cuda_on_both_sides() -> None:
    assert weight_sync_backend("cuda", "cuda") == "nccl"
    assert weight_sync_backend("cpu", "cpu") == "gloo"
    # A CUDA trainer with CPU engines (or the reverse) moves host tensors.
    assert weight_sync_backend("cuda", "cpu") == "gloo"
    assert weight_sync_backend("cpu", "cuda") == "gloo"


def test_buckets_keep_to_the_limit_and_one_dtype() -> None:
    items = [("a", 4, "f32"), ("b", 4, "f32"), ("c", 4, "f32"), ("d", 20, "f32"),
             ("e", 2, "bf16"), ("f", 2, "f32")]
    got = [[name for name, _, _ in b]
           for b in buckets(items, lambda i: i[1], lambda i: i[2], limit=8)]
    # a+b fill 8; c alone (d would pass it); d, bigger than the limit, alone; a dtype
    # change closes a bucket.
    assert got == [["a", "b"], ["c"], ["d"], ["e"], ["f"]]


def test_each_side_is_placed_by_its_label_and_colocated_by_none() -> None:
    dis = _cfg()
    assert side_labels(dis, RAY_SIDE_TRAIN) == {RAY_SIDE_LABEL: "train"}
    assert side_labels(dis, RAY_SIDE_ROLLOUT) == {RAY_SIDE_LABEL: "rollout"}
    colocated = Config.model_validate({"model": {"path": "m"},
                                       "data": {"train_files": ["d.jsonl"]}})
    assert side_labels(colocated, RAY_SIDE_TRAIN) is None
    # The side label and the nodes already holding a gang's group, in one selector.
    assert exclusion_selector(["n1"], {RAY_SIDE_LABEL: "train"}) == {
        RAY_SIDE_LABEL: "train", "ray.io/node-id": "!in(n1)"}
    assert exclusion_selector([], {RAY_SIDE_LABEL: "rollout"}) == {RAY_SIDE_LABEL: "rollout"}


def test_tensor_parallel_engines_apart_are_refused() -> None:
    """An engine apart is one vLLM process (test_engine_apart.py says why), whatever
    GPUs it is given."""
    assert _cfg(engine="vllm").rollout.engine == "vllm"  # one process per engine: fine
    for gpus in (1, 2):
        with pytest.raises(ValidationError) as err:
            _cfg(engine="vllm", tensor_parallel_size=2,
                 disaggregated={"engines_per_node": 2, "gpus_per_engine": gpus})
        assert "rollout.tensor_parallel_size: 2; a rollout engine apart" in str(err.value)


def test_engines_that_cannot_share_the_prompts_evenly_are_refused() -> None:
    _cfg()  # 4 prompts over 2 engines: fine
    with pytest.raises(ValidationError) as err:
        _cfg(disaggregated={"engines_per_node": 3})
    assert "rollout_batch_size (4) must be divisible by the rollout engines (3" in str(err.value)
