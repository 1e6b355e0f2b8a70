"""A disaggregated job rendered: the RayCluster's rollout worker group and its Ray side
labels, the trainer config's rollout section; a rollout pod's failure classified on the
rollout side and remediated there only. A colocated job renders as before."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from grpo_api.contract import RAY_SIDE_LABEL, ROLE_LABEL, FailureReason, RankStage
from grpo_api.job import parse_spec
from grpo_api.job.status import AttemptRecord, PlanStatus, RolloutPlanStatus
from grpo_api.trainer_config import Config
from grpo_operator.namespace_policy import template_gpus, templates
from grpo_operator.planner import next_safer_plan, plan_memory
from grpo_operator.reconcile.classify import PodOutcome, in_context, worker_outcome
from grpo_operator.reconcile.conditions import cluster_finding, workers_expected
from grpo_operator.reconcile.planning import planned
from grpo_operator.render import JobRef
from grpo_operator.render.children import render_children
from grpo_operator.render.trainer_config import trainer_config
from grpo_testbed.examples import example_job

pytestmark = pytest.mark.unit
JOB = JobRef("j", "ns", "uid-1")
H100_7B = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]


def disaggregated(**side: Any) -> dict[str, Any]:
    spec = copy.deepcopy(H100_7B)
    spec["rollout"] = {"placement": "disaggregated",
                       "disaggregated": {"gpuType": "L40S-48GB", "nodes": 2, **side}}
    return spec


def _cluster(raw: dict[str, Any]) -> dict[str, Any]:
    spec = parse_spec(raw)
    children = render_children(spec, plan_memory(spec), JOB, 0)
    return next(c for c in children if c["kind"] == "RayCluster")


def test_the_raycluster_gets_a_rollout_group_on_its_gpu_type_with_ray_side_labels() -> None:
    rc = _cluster(disaggregated())
    workers, rollout = rc["spec"]["workerGroupSpecs"]
    assert (workers["groupName"], rollout["groupName"]) == ("workers", "rollout")
    # Ray node labels in each group's top-level `labels` (KubeRay v1.5+ passes them to
    # `ray start --labels` and refuses rayStartParams' `labels`).
    assert workers["labels"] == {RAY_SIDE_LABEL: "train"}
    assert rollout["labels"] == {RAY_SIDE_LABEL: "rollout"}
    for group in (rc["spec"]["headGroupSpec"], workers, rollout):
        assert "labels" not in group["rayStartParams"]
    assert "labels" not in rc["spec"]["headGroupSpec"]
    assert rollout["replicas"] == rollout["minReplicas"] == rollout["maxReplicas"] == 2
    pod = rollout["template"]
    assert pod["metadata"]["labels"][ROLE_LABEL] == "rollout"
    assert workers["template"]["metadata"]["labels"][ROLE_LABEL] == "worker"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L40S"}
    assert pod["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    ray = pod["spec"]["containers"][0]
    assert ray["name"] == "ray-rollout"
    assert ray["resources"]["limits"]["nvidia.com/gpu"] == "8"
    # The job's env (its identity among it) reaches the rollout engines' pods too.
    env = {e["name"] for e in ray["env"]}
    assert {"GRPO_JOB_NAME", "PYTORCH_CUDA_ALLOC_CONF"} <= env


def test_the_rollout_pods_get_the_jobs_fabric_devices() -> None:
    """The weight push is NCCL from rank 0 to the engines, with the job's NCCL_NET: the
    rollout pods request spec.resources.devices and the capability they need, as the
    training workers do."""
    raw = disaggregated()
    raw["resources"] = {**raw["resources"], "devices": {"rdma/ib": 1}}
    workers, rollout = _cluster(raw)["spec"]["workerGroupSpecs"]
    for group in (workers, rollout):
        ray = group["template"]["spec"]["containers"][0]
        assert ray["resources"]["limits"]["rdma/ib"] == "1"
        assert "IPC_LOCK" in ray["securityContext"]["capabilities"]["add"]


def test_the_trainer_config_says_where_the_engines_run() -> None:
    spec = parse_spec(disaggregated(tensorParallelSize=1))
    plan = plan_memory(spec)
    raw = trainer_config(spec, plan, JOB)
    assert plan.rollout is not None
    assert raw["rollout"]["placement"] == "disaggregated"
    assert raw["rollout"]["max_staleness"] == 1
    assert raw["rollout"]["tensor_parallel_size"] == 1  # an engine apart is one process
    assert raw["rollout"]["disaggregated"] == {  # one engine per L40S of its 8 a node
        "nodes": 2, "engines_per_node": 8, "gpus_per_engine": 1,
        "cpus_per_engine": round(plan.rollout.cpus / 8, 3)}
    cfg = Config.model_validate(raw)
    assert cfg.rollout.disaggregated is not None and cfg.rollout.disaggregated.engines == 16
    assert raw["resources"]["num_workers"] == 8  # the training side's ranks only


def test_a_colocated_job_renders_as_before() -> None:
    """No rollout group, no Ray side labels, no placement in the trainer config (the
    trainer's default, colocated)."""
    spec = parse_spec(H100_7B)
    plan = plan_memory(spec)
    assert plan.rollout is None and plan.budget.rollout_side is None
    rc = _cluster(H100_7B)
    assert [g["groupName"] for g in rc["spec"]["workerGroupSpecs"]] == ["workers"]
    assert "labels" not in rc["spec"]["workerGroupSpecs"][0]
    raw = trainer_config(spec, plan, JOB)
    assert not {"placement", "max_staleness", "disaggregated"} & set(raw["rollout"])


def _rollout_pod(state: dict[str, Any]) -> dict[str, Any]:
    cs = [{"name": "ray-rollout", "state": state}]
    return {"metadata": {"name": "j-a0-rollout-x", "labels": {ROLE_LABEL: "rollout"}},
            "status": {"phase": "Failed", "containerStatuses": cs}}


def test_a_rollout_pods_oom_is_the_rollout_sides() -> None:
    oom = _rollout_pod({"terminated": {"exitCode": 137, "reason": "OOMKilled"}})
    out = worker_outcome(oom)
    assert out is not None
    assert (out.reason, out.side) == (FailureReason.HOST_OOM, "rollout")
    assert out.message.startswith("rollout pod j-a0-rollout-x:")
    head = PodOutcome(FailureReason.NODE_LOST, 5, "engine actor died")
    assert in_context(head, [oom]).side == "rollout"
    worker = dict(oom, metadata={"name": "w", "labels": {ROLE_LABEL: "worker"}})
    assert worker_outcome(worker) is not None
    assert worker_outcome(worker).side is None  # type: ignore[union-attr]


def test_a_lost_rollout_pod_does_not_end_the_attempt() -> None:
    """Deleted while it ran, or its `ray start` gone: KubeRay makes the pod again and the
    driver restarts the engine there; a training worker's loss still ends the attempt."""
    gone = _rollout_pod({"terminated": {"exitCode": 1, "reason": "Error"}})
    assert worker_outcome(gone) is None
    assert worker_outcome(dict(gone, status={"phase": "Running"}), deleted=True) is None
    worker = dict(gone, metadata={"name": "w", "labels": {ROLE_LABEL: "worker"}})
    lost = worker_outcome(worker)
    assert lost is not None and lost.reason is FailureReason.NODE_LOST


def test_a_rollout_side_cuda_oom_remediates_the_rollout_side_only() -> None:
    """Lower vLLM's share of the rollout GPU, and nothing more: never a larger TP there
    (an engine apart is one vLLM process), never the training ladder; the training side's
    settings and pods never change."""
    plan = plan_memory(parse_spec(disaggregated()))
    first = next_safer_plan(plan, FailureReason.CUDA_OOM, stage=RankStage.ROLLOUT)
    assert first is not None and first.rungs == ("lower rollout-side GPU memory utilisation",)
    assert first.settings.rollout_gpu_memory_utilization == 0.80
    assert first.budget.rollout_side is not None
    assert first.budget.rollout_side.tensor_parallel == 1
    assert first.worker == plan.worker and first.budget.gpu_stages == plan.budget.gpu_stages
    for knob in ("gradient_checkpointing", "micro_batch_tokens", "offload_optimizer",
                 "offload_params", "precision"):
        assert getattr(first.settings, knob) == getattr(plan.settings, knob)
    # Nothing left on the rollout side's GPU ladder; a kv_cache failure at the engine's
    # start has none (a larger TP would be the only relief).
    assert next_safer_plan(first, FailureReason.CUDA_OOM, stage=RankStage.ROLLOUT) is None
    assert next_safer_plan(plan, FailureReason.CUDA_OOM, stage=RankStage.KV_CACHE) is None
    # The same replayed from the attempts (what the next attempt's plan is).
    attempts = [AttemptRecord(index=0, outcome="HostOOM", remediation="x",
                              failed_side="rollout")]
    host = planned(parse_spec(disaggregated()), attempts)
    assert host.rollout is not None and plan.rollout is not None
    assert host.rollout.memory_gib > plan.rollout.memory_gib
    assert host.worker == plan.worker and host.settings.pod_memory_at_allocatable is False


def test_a_training_side_oom_of_a_disaggregated_job_keeps_the_rollout_side() -> None:
    plan = plan_memory(parse_spec(disaggregated()))
    safer = next_safer_plan(plan, FailureReason.CUDA_OOM, stage=RankStage.TRAINING)
    assert safer is not None and "rollout" not in safer.rungs[0]
    assert safer.budget.rollout_side == plan.budget.rollout_side
    assert safer.rollout == plan.rollout


def test_the_cluster_runs_once_both_sides_pods_do() -> None:
    """status.plan.nodes counts the training side; the rollout side's pods are waited for
    too, so a running rollout group does not stand in for training pods not yet made."""
    # Only the fields this reads: a written plan has every field (api status.PlanStatus).
    plan = PlanStatus.model_construct(nodes=1, rollout=RolloutPlanStatus.model_construct(nodes=2))
    assert workers_expected(plan) == 3
    assert workers_expected(PlanStatus.model_construct(nodes=2, rollout=None)) == 2

    def pod(name: str, role: str) -> dict[str, Any]:
        return {"metadata": {"name": name, "labels": {ROLE_LABEL: role}},
                "status": {"phase": "Running"}}

    pods = [pod("h", "head"), pod("r0", "rollout"), pod("r1", "rollout")]
    rc = {"status": {"state": "pending"}}
    assert cluster_finding(rc, pods, workers_expected(plan)).message == (
        "3 of 4 Ray pods running")
    done = cluster_finding(rc, [*pods, pod("w0", "worker")], workers_expected(plan))
    assert done.message == "head and 3 worker pod(s) running"


def test_admission_checks_and_counts_both_worker_groups() -> None:
    """The namespace's rules see the training workers' pod and the rollout pod apart, and
    its GPU quota counts both sides: 8 H100 + 2 x 8 L40S."""
    rc = _cluster(disaggregated())
    assert set(templates(rc)) == {"head", "worker", "rollout"}
    assert templates(rc)["rollout"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-L40S"}
    assert template_gpus(rc) == 8 + 2 * 8
