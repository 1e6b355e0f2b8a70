"""A cpu job with its rollouts apart (the e2e tier's tiny job, grpo_testbed.tiny_job.
disaggregated_example): the plan of both sides, the RayCluster (the head runs the ranks
and carries the training side's label; the rollout group has no GPU), the trainer's
config, and the refusals that keep cpu and GPU sides apart."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from grpo_api.contract import RAY_SIDE_LABEL, ROLE_LABEL
from grpo_api.job import SpecError, parse_spec
from grpo_operator.planner import plan_memory
from grpo_operator.planner.budget import RANK_PROCESS_CPU_GIB, cpu_engine_gib
from grpo_operator.render import JobRef
from grpo_operator.render.children import render_children
from grpo_operator.webhook import admission_problem
from grpo_testbed.examples import example_job
from grpo_testbed.tiny_job import disaggregated_example

pytestmark = pytest.mark.unit
JOB = JobRef("tiny-apart", "ns", "uid-1")


def apart() -> dict[str, Any]:
    return dict(disaggregated_example()["spec"])


def test_the_plan_puts_the_ranks_on_the_head_and_one_cpu_engine_on_a_rollout_pod() -> None:
    plan = plan_memory(parse_spec(apart()))
    side, rb = plan.geometry.rollout, plan.budget.rollout_side
    assert side is not None and rb is not None and plan.rollout is not None
    assert not side.is_gpu and plan.worker is None
    assert (rb.engines_per_node, rb.tensor_parallel, rb.terms) == (1, 1, {})
    # The rollout pod's host: one engine process, the engine's float32 weights and KV
    # cache for the whole rollout batch (it is the only engine), the object store.
    engine = cpu_engine_gib(plan.geometry, plan.settings.rollout_n, engines=1)
    assert rb.host_terms == {"rollout_engine_processes": RANK_PROCESS_CPU_GIB,
                             "cpu_rollout_engine": pytest.approx(engine),
                             "ray_object_store": plan.settings.ray_object_store_gib}
    # The training ranks hold no engine of their own.
    assert plan.budget.host_terms["cpu_rollout_engine"] == 0.0
    colocated = apart()
    del colocated["rollout"]
    assert plan_memory(parse_spec(colocated)).budget.host_terms["cpu_rollout_engine"] > 0
    # Two pods of 1 CPU each: the real node's 2 CPUs; memory within its 23 GiB.
    assert (plan.head.cpus, plan.rollout.cpus, plan.rollout.gpus) == (1, 1, 0)
    assert plan.head.memory_gib + plan.rollout.memory_gib <= 23
    assert plan.rollout.node_selector == {} and plan.rollout.tolerations == ()
    assert not plan.budget.problems()


def test_the_raycluster_labels_the_head_train_and_has_only_a_rollout_group() -> None:
    spec = parse_spec(apart())
    children = render_children(spec, plan_memory(spec), JOB, 0)
    rc = next(c for c in children if c["kind"] == "RayCluster")
    head = rc["spec"]["headGroupSpec"]
    assert head["labels"] == {RAY_SIDE_LABEL: "train"}
    assert "num-cpus" not in head["rayStartParams"]  # the head offers Ray its CPU: ranks
    (group,) = rc["spec"]["workerGroupSpecs"]
    assert group["groupName"] == "rollout" and group["labels"] == {RAY_SIDE_LABEL: "rollout"}
    pod = group["template"]
    assert pod["metadata"]["labels"][ROLE_LABEL] == "rollout"
    assert "nodeSelector" not in pod["spec"] and "tolerations" not in pod["spec"]
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["limits"] == {"cpu": "1", "memory": "8Gi"}
    # No preStop hook: a rollout pod going away must not stop the training (the hook
    # asks the driver to commit and stop).
    assert "lifecycle" not in pod["spec"]["containers"][0]
    config = next(c for c in children if c["kind"] == "ConfigMap")["data"]["config.yaml"]
    assert "gpus_per_engine: 0" in config and "ranks_on_head: true" in config


def test_a_colocated_cpu_job_s_head_carries_no_side_label() -> None:
    spec = parse_spec(example_job("grpojob-tiny.yaml")["spec"])
    rc = next(c for c in render_children(spec, plan_memory(spec), JOB, 0)
              if c["kind"] == "RayCluster")
    assert "labels" not in rc["spec"]["headGroupSpec"]
    assert "workerGroupSpecs" not in rc["spec"]


@pytest.mark.parametrize(("change", "found"), [
    ({"disaggregated": {"gpuType": "L40S-48GB", "nodes": 1}},
     "rollout.disaggregated.gpuType: L40S-48GB beside resources.gpuType cpu"),
    ({"disaggregated": {}}, "rollout.disaggregated.nodes: required for a cpu job"),
    ({"disaggregated": {"nodes": 1, "tensorParallelSize": 2}},
     "rollout.disaggregated.tensorParallelSize: 2; a rollout engine apart"),
])
def test_a_cpu_job_s_rollout_side_is_refused_naming_the_field(
        change: dict[str, Any], found: str) -> None:
    spec = apart()
    spec["rollout"] = {**spec["rollout"], **change}
    with pytest.raises(SpecError) as err:
        parse_spec(spec)
    assert found in str(err.value)
    assert found in (admission_problem(spec, None) or "")


def test_gpu_training_beside_cpu_rollouts_and_hf_engines_on_gpus_are_refused() -> None:
    gpu = copy.deepcopy(example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"])
    gpu["rollout"] = {"placement": "disaggregated",
                      "disaggregated": {"gpuType": "cpu", "nodes": 1}}
    assert "rollout.disaggregated.gpuType: cpu beside resources.gpuType H100-80GB" in (
        admission_problem(gpu, None) or "")
    gpu["rollout"] = {"placement": "disaggregated", "engine": "hf",
                      "disaggregated": {"nodes": 1}}
    assert "rollout.engine: hf with placement disaggregated on GPUs" in (
        admission_problem(gpu, None) or "")
    # On cpu the transformers engine is the default (auto) and may be named.
    spec = apart()
    spec["rollout"]["engine"] = "hf"
    assert plan_memory(parse_spec(spec)).geometry.rollout_engine == "hf"


def test_grpo_plan_shows_the_cpu_rollout_side_without_a_gpu_row() -> None:
    from rich.console import Console

    from grpo_operator.planner.report import plan_tables

    plan = plan_memory(parse_spec(apart()))
    side = next(d for d in plan.decisions if d.knob == "rollout side")
    assert side.value == "1 x 1 hf engine(s) on cpu" and "cpu_rollout_engine" in side.reason
    console = Console(record=True, width=200)
    console.print(plan_tables(plan))
    text = console.export_text()
    assert "rollout host" in text and "rollout GPU" not in text
