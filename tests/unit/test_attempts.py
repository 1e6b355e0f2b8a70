"""An attempt's life (pure): start, record how it ended, restart with the next plan."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import FailureReason as R
from grpo_api.job import parse_spec
from grpo_api.job.status import GRPOJobStatus
from grpo_operator.reconcile import Action, StoredStatus, read_status
from grpo_operator.reconcile.attempts import ensure_attempt, finish_attempt
from grpo_operator.reconcile.attempts import start_next_attempt as start
from grpo_operator.reconcile.classify import PodOutcome
from grpo_operator.reconcile.planning import Planner, backoff_seconds, planned
from grpo_operator.render import JobRef
from grpo_testbed.status_patch import apply_status_patch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOB = JobRef("j", "ns", "uid-1")
NOW = "2026-11-21T10:00:00Z"


def spec(example: str = "grpojob-qwen25vl-7b-a100-40gb.yaml", **restart: Any) -> dict[str, Any]:
    s: dict[str, Any] = yaml.safe_load((EXAMPLES / example).read_text())["spec"]
    s["backoffLimit"] = restart.pop("maxRestarts", 3)
    s["recovery"] = {"backoff": {"initialSeconds": 30, "maxSeconds": 100}, **restart}
    return s


def reconcile(sp: dict[str, Any]) -> Action:
    """A new job's first decision (the plan of its attempt 0)."""
    return ensure_attempt(JOB, Planner(sp).plan([], None), GRPOJobStatus(), NOW)


def started(sp: dict[str, Any]) -> dict[str, Any]:
    d = reconcile(sp).derive(StoredStatus(), 1, NOW)
    return apply_status_patch({}, d.status)


def finished(sp: dict[str, Any], st: dict[str, Any], outcome: PodOutcome,
             now: str = NOW) -> Action:
    """finish_attempt on the status `st` as stored, with its patch."""
    stored = read_status(st)
    return finish_attempt(stored.status, outcome, now, Planner(sp)).derive(stored, 1, now)


def oom(step: int = 12, ckpt: int = 10, reason: R = R.CUDA_OOM) -> PodOutcome:
    return PodOutcome(reason, 3, f"{reason.value} at step {step}", step, ckpt)


def test_first_reconcile_plans_and_renders_attempt_0() -> None:
    d = reconcile(spec()).derive(StoredStatus(), 1, NOW)
    kinds = [c["kind"] for c in d.children]
    assert kinds == ["ConfigMap", "PersistentVolumeClaim", "ServiceAccount", "Role",
                     "RoleBinding", "RayCluster"]
    assert d.status["phase"] == "Pending" and d.status["attempt"] == 0
    # Where the attempt's pods keep their output, on the job's checkpoint claim.
    assert d.status["attempts"] == [{"index": 0, "startTime": NOW, "outcome": "Running",
                                     "logs": "j-checkpoints:ns/j/attempts/0"}]
    assert any(e[1] == "Planned" for e in d.events)


def test_infeasible_job_fails_with_numbers_and_no_children() -> None:
    sp = spec("grpojob-qwen2vl-72b-h100.yaml")
    sp["resources"] = {"gpuType": "A100-40GB", "nodes": 1, "gpusPerNode": 1}
    d = reconcile(sp).derive(StoredStatus(), 1, NOW)
    assert d.status["phase"] == "Failed" and not d.children
    failed = next(c for c in d.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "Infeasible" and "GiB" in failed["message"]


def test_backoff_is_exponential_and_capped() -> None:
    s = parse_spec(spec())
    assert [backoff_seconds(s, r) for r in range(4)] == [30, 60, 100, 100]


def test_cuda_oom_restarts_after_backoff_with_the_first_rung() -> None:
    sp = spec()
    st = started(sp)
    d = finished(sp, st, oom())
    assert d.status["phase"] == "Restarting" and d.status["restarts"] == 1
    assert d.status["nextAttempt"] == {"index": 1, "notBefore": "2026-11-21T10:00:30.000Z"}
    rec = d.status["attempts"][0]
    assert rec["outcome"] == "CudaOOM" and rec["lastCheckpointStep"] == 10
    assert rec["remediation"].startswith("CudaOOM")
    assert d.delete_ray_cluster == "j-a0"
    merged = apply_status_patch(st, d.status)
    backing_off = start(JOB, Planner(sp), read_status(merged).status, "2026-11-21T10:00:29.999Z")
    assert backing_off is None
    nxt = start(JOB, Planner(sp), read_status(merged).status, "2026-11-21T10:00:30Z")
    assert nxt is not None
    nxt.derive(read_status(merged), 1, "2026-11-21T10:00:30Z")
    assert nxt.status["attempt"] == 1 and nxt.status["nextAttempt"] is None
    assert nxt.status["attempts"][1]["resumedFromStep"] == 10
    rc = next(c for c in nxt.children if c["kind"] == "RayCluster")
    assert rc["metadata"]["name"] == "j-a1"
    # The replayed plan is the remediated one, and differs from attempt 0's.
    plan0 = planned(parse_spec(sp))
    plan1 = planned(parse_spec(sp), read_status(merged).status.attempts)
    assert plan1.settings != plan0.settings and plan1.remediations


def test_a_rollout_oom_is_recorded_with_its_stage_and_replayed_the_same_way() -> None:
    """The attempt keeps `failedStage`, so the next attempt's plan (replayed from the
    attempts, as the operator keeps no plan of its own) is the rollout rung too."""
    from grpo_api.contract import RankStage

    sp = spec()
    st = started(sp)
    out = PodOutcome(R.CUDA_OOM, 3, "CudaOOM at step 12", 12, 10, RankStage.ROLLOUT)
    d = finished(sp, st, out)
    rec = d.status["attempts"][0]
    assert rec["failedStage"] == "rollout"
    assert "lower rollout GPU memory utilisation" in rec["remediation"]
    merged = apply_status_patch(st, d.status)  # checked against the CRD's schema
    plan0 = planned(parse_spec(sp))
    plan1 = planned(parse_spec(sp), read_status(merged).status.attempts)
    assert (plan1.settings.rollout_gpu_memory_utilization
            < plan0.settings.rollout_gpu_memory_utilization)
    assert plan1.settings.gradient_checkpointing == plan0.settings.gradient_checkpointing


def test_an_attempt_recorded_as_failed_phase_by_an_older_operator_replays_the_same() -> None:
    """failedPhase (the field's name before the rename) is read as failedStage: the
    replayed plan is the rollout rung, and what is written next says failedStage only."""
    from grpo_api.contract import RankStage

    sp = spec()
    st = started(sp)
    out = PodOutcome(R.CUDA_OOM, 3, "CudaOOM at step 12", 12, 10, RankStage.ROLLOUT)
    merged = apply_status_patch(st, finished(sp, st, out).status)
    older = merged["attempts"][0]
    older["failedPhase"] = older.pop("failedStage")
    merged = apply_status_patch(st, {"attempts": [older]})  # the CRD keeps the old name
    assert merged["attempts"][0]["failedPhase"] == "rollout"
    parsed = read_status(merged).status.attempts
    assert parsed[0].failed_stage == RankStage.ROLLOUT
    assert "failedPhase" not in parsed[0].to_wire()
    plan = planned(parse_spec(sp), parsed)
    assert (plan.settings.rollout_gpu_memory_utilization
            < planned(parse_spec(sp)).settings.rollout_gpu_memory_utilization)


def test_remediate_false_restarts_unchanged() -> None:
    sp = spec(remediate=False)
    st = started(sp)
    d = finished(sp, st, oom())
    assert d.status["phase"] == "Restarting" and "remediation" not in d.status["attempts"][0]


def test_config_error_is_permanent() -> None:
    sp = spec()
    st = started(sp)
    bad = PodOutcome(R.CONFIG_ERROR, 2, "bad")
    d = finished(sp, st, bad)
    assert d.status["phase"] == "Failed" and "nextAttempt" not in d.status


def test_give_up_message_says_what_happened_and_what_was_tried() -> None:
    sp = spec(maxRestarts=1)
    st = started(sp)
    ended = finished(sp, st, oom())
    st = apply_status_patch(st, ended.status)
    nxt = start(JOB, Planner(sp), read_status(st).status, "2026-11-21T10:01:00Z")
    assert nxt is not None
    st = apply_status_patch(st, nxt.derive(read_status(st), 1, "2026-11-21T10:01:00Z").status)
    d = finished(sp, st, oom(step=20), "2026-11-21T10:02:00Z")
    failed = next(c for c in d.status["conditions"] if c["type"] == "Failed")
    assert d.status["phase"] == "Failed"
    assert failed["message"].startswith("CUDA OOM at step 20 after 1 restarts; last setting tried:")
    assert "planned settings" not in failed["message"]


def test_an_outcome_is_recorded_once() -> None:
    sp = spec()
    st = started(sp)
    ended = finished(sp, st, oom())
    st = apply_status_patch(st, ended.status)
    assert finished(sp, st, oom()).status == {}


def pvc(*modes: str) -> dict[str, Any]:
    return {"spec": {"accessModes": list(modes)}}


RWO, RWX, ROX = pvc("ReadWriteOnce"), pvc("ReadWriteMany"), pvc("ReadOnlyMany")


def test_named_claim_must_exist_and_be_shared_by_every_pod() -> None:
    from grpo_operator.reconcile.claims import claim_problem

    sp = spec("grpojob-qwen25vl-7b-h100.yaml")  # nodes: 1, i.e. a head and a worker pod
    sp["checkpoint"] = {"claimName": "ckpt"}
    sp = parse_spec(sp)
    assert "checkpoint.claimName 'ckpt' does not exist in ns" in str(
        claim_problem(sp, "ns", None, None, 2))
    assert claim_problem(sp, "ns", RWO, None, 2) == (
        "checkpoint.claimName 'ckpt' is ReadWriteOnce (one node only), but all 2 Ray pods "
        "of this job (the head and its workers, as a rule on different nodes) mount it "
        "read-write: use a ReadWriteMany claim")
    assert "ReadWriteOncePod (one pod only)" in str(
        claim_problem(sp, "ns", pvc("ReadWriteOncePod"), None, 9))
    assert claim_problem(sp, "ns", RWX, None, 2) is None
    assert claim_problem(sp, "ns", RWO, None, 1) is None  # the head alone (cpu, nodes 0)
    assert claim_problem(sp, "ns", ROX, None, 1) == (
        "checkpoint.claimName 'ckpt' is ReadOnlyMany (read-only mounts only), but the job's "
        "one pod mounts it read-write: use a ReadWriteMany claim")
    assert claim_problem(parse_spec(spec()), "ns", None, None, 2) is None  # size: made


def test_a_model_claim_must_exist_and_be_readable_from_every_pod() -> None:
    from grpo_operator.reconcile.claims import claim_problem

    sp = spec("grpojob-qwen25vl-7b-h100.yaml")
    sp["model"] = {**sp["model"], "claimName": "weights", "path": "/models/qwen"}
    sp = parse_spec(sp)
    assert "model.claimName 'weights' does not exist in ns" in str(
        claim_problem(sp, "ns", None, None, 2))
    assert claim_problem(sp, "ns", None, RWO, 2) == (
        "model.claimName 'weights' is ReadWriteOnce (one node only), but all 2 Ray pods of "
        "this job (the head and its workers, as a rule on different nodes) mount it "
        "read-only: use a ReadOnlyMany or ReadWriteMany claim")
    assert claim_problem(sp, "ns", None, ROX, 2) is None  # mounted read-only everywhere
    assert claim_problem(sp, "ns", None, RWX, 2) is None
    assert claim_problem(sp, "ns", None, RWO, 1) is None


def test_the_pods_a_claim_must_serve_come_from_the_plan() -> None:
    def pods(sp: dict[str, Any]) -> int:
        return planned(parse_spec(sp)).pods

    one_node = spec("grpojob-qwen25vl-7b-h100.yaml")
    assert pods(one_node) == 2  # `nodes: 1` is a CPU head and a GPU worker
    unset = spec("grpojob-qwen2vl-72b-h100.yaml")
    del unset["resources"]["nodes"]  # the planner resolves it
    assert pods(unset) > 2
    assert pods(spec("grpojob-tiny.yaml")) == 1  # the head runs the ranks


@pytest.mark.parametrize(("example", "mode"), [
    ("grpojob-qwen25vl-7b-h100.yaml", "ReadWriteMany"),  # nodes: 1 is already two pods
    ("grpojob-tiny.yaml", "ReadWriteOnce"),  # one pod
])
def test_the_operators_claim_is_shared_whenever_the_job_has_several_pods(
        example: str, mode: str) -> None:
    kids = reconcile(spec(example)).children
    claim = next(c for c in kids if c["kind"] == "PersistentVolumeClaim")
    assert claim["spec"]["accessModes"] == [mode]


def test_model_claim_is_mounted_read_only_at_models_in_every_ray_pod() -> None:
    sp = spec("grpojob-qwen25vl-7b-h100.yaml")
    sp["model"] = {**sp["model"], "claimName": "weights", "path": "/models/qwen2.5-vl-7b"}
    rc = next(c for c in reconcile(sp).children if c["kind"] == "RayCluster")
    groups = [rc["spec"]["headGroupSpec"], *rc["spec"]["workerGroupSpecs"]]
    for g in groups:
        pod = g["template"]["spec"]
        vol = next(v for v in pod["volumes"] if v["name"] == "models")
        assert vol["persistentVolumeClaim"] == {"claimName": "weights", "readOnly": True}
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "models")
        assert mount == {"name": "models", "mountPath": "/models", "readOnly": True}
    without = reconcile(spec("grpojob-qwen25vl-7b-h100.yaml")).children
    rc0 = next(c for c in without if c["kind"] == "RayCluster")
    assert all(v["name"] != "models" for v in rc0["spec"]["headGroupSpec"]["template"]["spec"]
               ["volumes"])


def ray_cluster(example: str) -> dict[str, Any]:
    kids = reconcile(spec(example)).children
    return next(c for c in kids if c["kind"] == "RayCluster")


def test_a_head_with_workers_offers_ray_no_cpu_or_gpu_for_ranks() -> None:
    rc = ray_cluster("grpojob-qwen25vl-7b-h100.yaml")
    head = rc["spec"]["headGroupSpec"]["rayStartParams"]
    worker = rc["spec"]["workerGroupSpecs"][0]["rayStartParams"]
    assert head["num-cpus"] == "0" and head["num-gpus"] == "0"
    assert head["object-store-memory"] == worker["object-store-memory"]
    # The workers' CPUs and GPUs come from their limits (KubeRay derives them).
    assert "num-cpus" not in worker and "num-gpus" not in worker


def test_a_head_that_runs_the_ranks_itself_keeps_its_cpus() -> None:
    rc = ray_cluster("grpojob-tiny.yaml")
    assert "workerGroupSpecs" not in rc["spec"]
    assert "num-cpus" not in rc["spec"]["headGroupSpec"]["rayStartParams"]
