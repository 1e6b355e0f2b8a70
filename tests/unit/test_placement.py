"""Rank placement, pure part: which node and local rank each rank gets, TP groups inside a
node, the config fields that describe the layout, the CUDA device a rank picks, and the
WorkersMissing message. (The Ray part runs for real in tests/trainer/test_multinode.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest

from grpo_api.contract import ExitCode, FailureReason
from grpo_api.job import load_manifest
from grpo_api.job.status import AttemptOutcome
from grpo_operator.planner import plan_memory
from grpo_operator.render.names import JobRef
from grpo_operator.render.trainer_config import trainer_config
from grpo_trainer.cluster.placement import (
    NodeView,
    RankPlace,
    cuda_device_index,
    exclusion_selector,
    layout_for,
    missing_detail,
    nodes_to_join,
    plan_layout,
)
from grpo_trainer.config import build_config
from grpo_trainer.config_error import ConfigError
from grpo_trainer.errors import WorkersMissingError, classify

pytestmark = pytest.mark.unit
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("grpojob-*.yaml"))
GPU = {"CPU": 1.0, "GPU": 1.0}


def _cfg(**resources: Any) -> dict[str, Any]:
    return {
        "model": {"path": "m"},
        "data": {"train_files": ["d.jsonl"]},
        "rollout": {"engine": "vllm", "tensor_parallel_size": resources.pop("tp", 1)},
        "resources": resources,
        "trainer": {"rollout_batch_size": 64},
    }


def test_ranks_fill_nodes_in_order_and_tp_groups_stay_inside_a_node() -> None:
    lay = plan_layout(8, 8, GPU, 4)
    assert lay.world_size == 64
    assert lay.place(0) == RankPlace(0, 0, 0)
    assert lay.place(7) == RankPlace(7, 0, 7)
    assert lay.place(8) == RankPlace(8, 1, 0)
    assert lay.place(63) == RankPlace(63, 7, 7)
    assert [p.rank for p in lay.places] == list(range(64))
    assert lay.node_bundles() == [GPU] * 8
    for group in lay.tp_groups():
        assert len({lay.place(r).node for r in group}) == 1, group
    assert len(lay.tp_groups()) == 16
    with pytest.raises(IndexError):
        lay.place(64)


def test_a_tp_group_that_would_span_nodes_is_a_config_error_naming_both_fields() -> None:
    with pytest.raises(ConfigError) as err:
        plan_layout(2, 2, GPU, 4)
    assert err.value.field == "rollout.tensor_parallel_size"
    assert "resources.ranks_per_node (2)" in str(err.value) and "one node" in str(err.value)
    # 4 ranks on 1 node hold a TP-4 group; the same 4 ranks on 2 nodes do not.
    cfg = build_config(_cfg(num_workers=4, tp=4), environ={})
    assert layout_for(cfg).nodes == 1
    spread = build_config(_cfg(num_workers=4, nodes=2, tp=4), environ={})
    with pytest.raises(ConfigError, match="must lie inside one node"):
        layout_for(spread)


def test_the_layout_fields_must_add_up() -> None:
    cfg = build_config(_cfg(num_workers=8), environ={})
    assert (cfg.resources.nodes, cfg.resources.node_ranks) == (1, 8)  # the local default
    cfg = build_config(_cfg(num_workers=8, nodes=2), environ={})
    assert cfg.resources.node_ranks == 4
    with pytest.raises(ConfigError) as err:
        build_config(_cfg(num_workers=8, nodes=2, ranks_per_node=3), environ={})
    assert err.value.field == "resources.num_workers"
    assert "resources.nodes x resources.ranks_per_node (2 x 3)" in str(err.value)
    with pytest.raises(ConfigError) as err:
        build_config(_cfg(num_workers=8, nodes=3), environ={})
    assert err.value.field == "resources.nodes"
    with pytest.raises(ConfigError, match="gang_timeout_s"):
        build_config(_cfg(num_workers=8, gang_timeout_s=0), environ={})


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_operator_renders_one_node_per_worker_pod(path: Path) -> None:
    spec = load_manifest(path).spec
    plan = plan_memory(spec)
    cfg = build_config(trainer_config(spec, plan, JobRef("j", "ns", "u")), environ=plan.env)
    geo, res = plan.geometry, cfg.resources
    lay = layout_for(cfg)  # the planner's TP fits inside a node
    assert lay.world_size == plan.world_size == res.num_workers
    assert (lay.nodes, lay.ranks_per_node) == (max(1, geo.nodes), geo.gpus_per_node)
    # Worker pods exist: the head runs only the driver. No worker pods (cpu): it runs all.
    assert res.ranks_on_head is (geo.nodes == 0)
    assert ("GPU" in lay.bundle) is geo.is_gpu


def test_the_cuda_device_is_the_gpu_ray_reserved_for_the_bundle() -> None:
    assert cuda_device_index([5], "5", local_rank=3) == 0  # Ray masked the process to it
    assert cuda_device_index(["5"], "0,1,2,3,4,5,6,7", local_rank=3) == 5  # nothing masked
    assert cuda_device_index([2], None, local_rank=3) == 2
    assert cuda_device_index([], None, local_rank=3) == 3  # no Ray: the local rank
    with pytest.raises(RuntimeError, match="CUDA_VISIBLE_DEVICES"):
        cuda_device_index([5], "0,1", local_rank=0)


def test_the_workers_missing_message_counts_nodes_and_shows_what_ray_sees() -> None:
    lay = plan_layout(3, 2, GPU, 1)
    alive = [
        NodeView("b" * 56, "10.0.0.3", False, {"CPU": 2.0, "GPU": 2.0, "memory": 1e9}),
        NodeView("h" * 56, "10.0.0.1", True, {"CPU": 0.0, "node:__internal_head__": 1.0}),
        NodeView("a" * 56, "10.0.0.2", False, {"CPU": 2.0, "GPU": 2.0}),
    ]
    text = missing_detail(lay, ["a" * 56, "b" * 56], 10, alive, ranks_on_head=False)
    first = text.splitlines()[0]
    assert "only 2 of 3 nodes placed within 10 s of enough nodes joining" in first
    assert "1 node(s) missing" in first
    assert "2 ranks x {CPU 1, GPU 1}" in first and "not the head node" in first
    lines = text.splitlines()[1:]
    assert lines[0] == "Ray sees 3 alive node(s):"
    assert lines[1].startswith("  head 10.0.0.1 (hhhhhhhh): CPU 0; no ranks here")
    assert "10.0.0.2 (aaaaaaaa): CPU 2, GPU 2; holds node 0's ranks" in lines[2]
    assert "10.0.0.3 (bbbbbbbb): CPU 2, GPU 2; holds node 1's ranks" in lines[3]


def test_the_gang_waits_without_a_deadline_only_while_nodes_are_missing() -> None:
    """Pods waiting for capacity have no Ray node yet: that wait is not a failure. The
    deadline counts once enough nodes are alive: free, off the head unless ranks go there,
    with the side's labels (a disaggregated job)."""
    head = NodeView("h" * 56, "10.0.0.1", True, {"CPU": 2.0})
    a = NodeView("a" * 56, "10.0.0.2", False, {"GPU": 2.0}, {"grpo.dev/side": "train"})
    b = NodeView("b" * 56, "10.0.0.3", False, {"GPU": 2.0}, {"grpo.dev/side": "rollout"})
    assert nodes_to_join([head, a], [], 2, ranks_on_head=False) == 1
    assert nodes_to_join([head, a], [], 2, ranks_on_head=True) == 0
    assert nodes_to_join([head, a, b], [], 2, ranks_on_head=False) == 0
    assert nodes_to_join([head, a, b], [], 2, ranks_on_head=False,
                         labels={"grpo.dev/side": "train"}) == 1
    # A node already holding a group counts for none of those left.
    assert nodes_to_join([head, a, b], [a.node_id], 2, ranks_on_head=False) == 1
    assert nodes_to_join([head, a, b], [a.node_id], 1, ranks_on_head=False) == 0


def test_workers_missing_exits_5_with_its_own_reason() -> None:
    err = RuntimeError("gang")
    err.__cause__ = WorkersMissingError("only 2 of 3 nodes placed within 10 s")
    c = classify(err)
    assert (c.code, c.reason) == (ExitCode.WORKER_LOST, FailureReason.WORKERS_MISSING)
    assert "2 of 3 nodes" in c.detail


def test_every_failure_reason_is_an_attempt_outcome() -> None:
    assert {r.value for r in FailureReason} <= set(get_args(AttemptOutcome))


def test_the_node_exclusion_selector_has_no_spaces() -> None:
    assert exclusion_selector([]) is None
    assert exclusion_selector(["h1", "n2"]) == {"ray.io/node-id": "!in(h1,n2)"}


@pytest.mark.parametrize(("nodes", "cpus"), [(0, 2), (1, 1), (1, 2), (2, 4)])
def test_a_nodes_ranks_ask_ray_for_no_more_cpus_than_their_pod_offers(
        nodes: int, cpus: int) -> None:
    """Found on the testbed's real node: a 1-CPU worker pod (Ray num-cpus 1) with two
    ranks of 1 CPU each left the placement group pending until the gang deadline."""
    path = next(p for p in EXAMPLES if p.name == "grpojob-tiny.yaml")
    spec = load_manifest(path).spec.model_copy(deep=True)
    spec.resources.nodes, spec.resources.cpus_per_node = nodes, cpus
    plan = plan_memory(spec)
    cfg = build_config(trainer_config(spec, plan, JobRef("j", "ns", "u")), environ=plan.env)
    pod = plan.worker or plan.head
    assert (pod is plan.head) is (nodes == 0)
    lay = layout_for(cfg)
    assert lay.bundle["CPU"] * lay.ranks_per_node <= pod.cpus
    assert lay.bundle["CPU"] > 0
