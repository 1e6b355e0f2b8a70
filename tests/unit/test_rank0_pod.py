"""Each pod asks for what it needs: rank 0 alone reads the whole model at load
(rank0Init), so with two or more training nodes its node gets a worker group of its own
with that memory, and the other workers ask for their own, smaller peak. The trainer
places ranks 0.. on the Ray node labelled for it; `grpo plan` shows each pod and the
total a platform team pays."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from grpo_api.contract import RANK0_GROUP, RANK0_NODE_LABEL, FailureReason
from grpo_api.job import load_manifest, parse_manifest
from grpo_operator.planner import next_safer_plan, plan_memory
from grpo_operator.planner.headroom import headroom
from grpo_operator.planner.resources import HOST_HEADROOM, pod_need_gib
from grpo_operator.planner.types import RANK0_LOAD_TERM
from grpo_operator.render import render_children
from grpo_operator.render.names import JobRef
from grpo_operator.render.trainer_config import trainer_config
from grpo_trainer.config import build_config

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BIG = EXAMPLES / "grpojob-qwen2vl-72b-h100.yaml"  # 8 x 8 H100, rank0Init
JOB = JobRef("big", "ns", "uid")


def test_the_72b_example_asks_rank_0s_node_alone_for_the_model_load() -> None:
    plan = plan_memory(load_manifest(BIG).spec)
    b, geo = plan.budget, plan.geometry
    assert plan.settings.rank0_init and geo.nodes == 8
    assert plan.rank0 is not None and plan.worker is not None
    assert (plan.rank0.replicas, plan.worker.replicas) == (1, geo.nodes - 1)
    assert plan.rank0.role == RANK0_GROUP
    # Rank 0's pod holds its whole peak (the load); the others their own (steady here).
    assert b.host_load_terms[RANK0_LOAD_TERM] > 250
    assert plan.rank0.memory_gib >= b.peak_host_gib / HOST_HEADROOM
    assert b.peak_host_other_gib == pytest.approx(max(
        sum(b.host_terms.values()),
        sum(b.host_load_terms.values()) - b.host_load_terms[RANK0_LOAD_TERM]))
    assert plan.worker.memory_gib >= b.peak_host_other_gib
    assert plan.worker.memory_gib < plan.rank0.memory_gib / 4
    # Everything else about the two is the same node shape.
    for key in ("gpus", "cpus", "node_selector", "tolerations", "devices", "capabilities"):
        assert getattr(plan.rank0, key) == getattr(plan.worker, key), key
    # What a platform team pays: far below every node asking for rank 0's memory.
    total = plan.rank0.memory_gib + 7 * plan.worker.memory_gib
    assert total < 0.3 * 8 * plan.rank0.memory_gib
    assert plan.pods == 1 + geo.nodes


def test_the_raycluster_has_a_rank0_group_and_the_trainer_places_rank_0_there() -> None:
    spec = load_manifest(BIG).spec
    plan = plan_memory(spec)
    (rc,) = [c for c in render_children(spec, plan, JOB, 0) if c["kind"] == "RayCluster"]
    groups = {g["groupName"]: g for g in rc["spec"]["workerGroupSpecs"]}
    assert list(groups) == [RANK0_GROUP, "workers"]
    assert plan.rank0 is not None and plan.worker is not None
    for name, pod in ((RANK0_GROUP, plan.rank0), ("workers", plan.worker)):
        g = groups[name]
        assert g["replicas"] == g["minReplicas"] == g["maxReplicas"] == pod.replicas
        c = g["template"]["spec"]["containers"][0]
        assert c["resources"]["limits"]["memory"] == f"{pod.memory_gib}Gi"
        assert c["resources"]["requests"]["memory"] == f"{pod.memory_gib}Gi"
        assert g["template"]["metadata"]["labels"]["grpo.dev/role"] == "worker"
    assert groups[RANK0_GROUP]["labels"] == {RANK0_NODE_LABEL: "true"}
    assert "labels" not in groups["workers"]
    cfg = build_config(trainer_config(spec, plan, JOB), environ=plan.env)
    assert cfg.resources.rank0_node_labels == {RANK0_NODE_LABEL: "true"}


@pytest.mark.parametrize("example", ["grpojob-qwen25vl-7b-h100.yaml", "grpojob-tiny.yaml",
                                     "grpojob-qwen25vl-72b-lora-h100.yaml"])
def test_one_node_or_the_head_alone_keeps_one_worker_group(example: str) -> None:
    spec = load_manifest(EXAMPLES / example).spec
    plan = plan_memory(spec)
    assert plan.rank0 is None
    cfg = build_config(trainer_config(spec, plan, JOB), environ=plan.env)
    assert cfg.resources.rank0_node_labels is None


def test_without_rank0_init_every_rank_loads_and_every_pod_asks_the_same() -> None:
    doc = yaml.safe_load(BIG.read_text())
    doc["spec"].setdefault("memory", {})["rank0Init"] = False
    doc["spec"]["resources"]["nodes"] = 8
    plan = plan_memory(parse_manifest(doc, "test").spec)
    assert plan.rank0 is None and plan.worker is not None and plan.worker.replicas == 8


def test_a_host_oom_ladder_keeps_no_pod_below_its_last_and_ends_at_allocatable() -> None:
    plan = plan_memory(load_manifest(BIG).spec)
    assert plan.rank0 is not None
    room = headroom(plan, FailureReason.HOST_OOM)
    assert room[f"{RANK0_GROUP}.memory"] == pytest.approx(
        plan.rank0.memory_gib - pod_need_gib(plan.geometry, plan.settings, plan.budget,
                                             RANK0_GROUP))
    assert room["worker.memory"] > 0
    last = plan
    while (nxt := next_safer_plan(last, FailureReason.HOST_OOM)) is not None:
        for old, new in ((last.worker, nxt.worker), (last.rank0, nxt.rank0)):
            if old is not None and new is not None:
                assert new.memory_gib >= old.memory_gib
        last = nxt
    # The last rung asks every pod for the node's allocatable: one group again.
    assert last.settings.pod_memory_at_allocatable
    assert last.rank0 is None and last.worker is not None
    assert last.worker.replicas == 8


def test_grpo_plan_shows_each_pod_and_the_total(tmp_path: Path) -> None:
    from grpo_operator.cli import cli

    res = CliRunner().invoke(cli, ["plan", str(BIG), "--offline", "-o", "json"])
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    pods = plan["pods"]
    assert pods[RANK0_GROUP]["replicas"] == 1 and pods["worker"]["replicas"] == 7
    total = plan["podTotals"]
    assert total["pods"] == 9 and total["gpus"] == 64
    assert total["memoryGiB"] == (pods["head"]["memoryGiB"] + pods[RANK0_GROUP]["memoryGiB"]
                                  + 7 * pods["worker"]["memoryGiB"])
    table = CliRunner().invoke(cli, ["plan", str(BIG), "--offline"])
    assert "total (all pods)" in table.stdout and "rank0Pod" in table.stdout
