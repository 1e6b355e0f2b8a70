"""Kueue (spec.queueName): queued with Kueue's reason, admitted, preempted without
costing a restart (pure reconcile; the cluster tier runs the real Kueue)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import MAX_RESTARTS
from grpo_operator import reconcile as rec
from grpo_operator.config import OperatorConfig
from grpo_operator.reconcile import Action, Observed
from grpo_operator.reconcile.retention import DELETE_ADVICE, RETAIN_ADVICE
from grpo_operator.webhook import admission_problem
from grpo_testbed.status_patch import apply_status_patch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/grpojob-qwen25vl-7b-h100.yaml"
CONFIG = OperatorConfig(default_image="registry.example/trainer:test")
T0 = "2026-11-21T10:00:00.000Z"
T1 = "2026-11-21T10:01:00.000Z"
SHORT = ("couldn't assign flavors to pod set workers: insufficient unused quota for "
         "nvidia.com/gpu in flavor h100-80gb, 8 more needed")
EVICTED = ("Preempted to accommodate a workload (UID: w2, JobUID: r2) due to "
           "prioritization in the ClusterQueue")


def new_job(queue: str | None = "team-a") -> dict[str, Any]:
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    if queue:
        spec["queueName"] = queue
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1},
            "spec": spec, "status": {}}


def queued_job() -> dict[str, Any]:
    return new_job()


def step(job: dict[str, Any], event: Any, now: str = T0,
         observed: Observed | None = None) -> tuple[dict[str, Any], Action]:
    """One decision, and the job as the API server stores it after the status patch."""
    action = rec.reconcile(job, observed or Observed(), event, now, CONFIG)
    out = copy.deepcopy(job)
    out["status"] = apply_status_patch(out["status"], action.status)
    return out, action


def head_pod() -> dict[str, Any]:
    return {"metadata": {"name": "j-a0-head", "labels": {
        "grpo.dev/job": "j", "grpo.dev/attempt": "0", "grpo.dev/role": "head"}},
        "status": {"phase": "Running", "containerStatuses": [
            {"name": "ray-head", "state": {"running": {}}}]}}


def cluster(attempt: int = 0, suspend: bool = True, state: str | None = None,
            generation: int = 1) -> dict[str, Any]:
    """A RayCluster as Kueue's webhook leaves it: labelled with its queue, suspended
    (Kueue's unsuspend and a later suspend each make a new generation)."""
    return {"metadata": {"name": f"j-a{attempt}", "uid": f"rc{attempt}",
                         "generation": generation,
                         "labels": {"grpo.dev/job": "j", "grpo.dev/attempt": str(attempt),
                                    "kueue.x-k8s.io/queue-name": "team-a"}},
            "spec": {"suspend": suspend}, "status": {"state": state} if state else {}}


def workload(*conditions: dict[str, str], cq: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": list(conditions)}
    if cq:
        status["admission"] = {"clusterQueue": cq}
    return {"metadata": {"name": "raycluster-j-a0-1"}, "status": status}


def cond(kind: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


def condition(job: dict[str, Any], kind: str) -> dict[str, Any]:
    return next(c for c in job["status"]["conditions"] if c["type"] == kind)


def admitted_running_job() -> dict[str, Any]:
    job, _ = step(queued_job(), rec.SpecChanged())
    job, _ = step(job, rec.ClusterChanged(cluster()), observed=Observed(
        workload=workload(cond("QuotaReserved", "False", "Pending", SHORT))))
    admitted = workload(cond("QuotaReserved", "True", "QuotaReserved"),
                        cond("Admitted", "True", "Admitted"), cq="grpo-gpus")
    job, action = step(job, rec.ClusterChanged(cluster(suspend=False, state="ready",
                                                       generation=2)),
                       observed=Observed(workload=admitted))
    assert ("Normal", "Admitted", "Kueue admitted RayCluster j-a0 from LocalQueue team-a in "
            "ClusterQueue grpo-gpus") in action.events
    assert job["status"]["phase"] == "Running"
    assert job["status"]["rayCluster"]["admittedGeneration"] == 2
    return job


def test_the_attempts_cluster_carries_the_queue_label_and_no_suspend() -> None:
    _, action = step(queued_job(), rec.SpecChanged())
    rc = next(c for c in action.children if c["kind"] == "RayCluster")
    assert rc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    assert "suspend" not in rc["spec"]  # Kueue's webhook sets it; the operator never does
    _, plain = step(new_job(queue=None), rec.SpecChanged())
    assert all("kueue.x-k8s.io/queue-name" not in c["metadata"].get("labels", {})
               for c in plain.children)


def test_a_held_cluster_is_queued_with_kueues_reason_and_clusterqueue() -> None:
    job, _ = step(queued_job(), rec.SpecChanged())
    job, action = step(job, rec.ClusterChanged(cluster()), observed=Observed(
        workload=workload(cond("QuotaReserved", "False", "Pending", SHORT)),
        cluster_queue="grpo-gpus"))
    assert job["status"]["phase"] == "Queued"
    queued = condition(job, "Queued")
    assert queued["status"] == "True" and queued["reason"] == "Pending"
    assert queued["message"] == (f"queued in LocalQueue team-a (ClusterQueue grpo-gpus): "
                                 f"{SHORT}")
    assert condition(job, "Ready")["status"] == "False"
    assert [e[1] for e in action.events] == ["Queued"]
    # Kueue's Workload not made yet, or a LocalQueue that does not exist: still said.
    fresh, _ = step(queued_job(), rec.SpecChanged())
    fresh, _ = step(fresh, rec.ClusterChanged(cluster()))
    assert condition(fresh, "Queued")["reason"] == "WaitingForWorkload"
    missing, _ = step(fresh, rec.ClusterChanged(cluster()), observed=Observed(
        workload=workload(cond("QuotaReserved", "False", "Inadmissible",
                               "LocalQueue team-a doesn't exist"))))
    assert condition(missing, "Queued")["reason"] == "Inadmissible"
    assert "LocalQueue team-a doesn't exist" in condition(missing, "Queued")["message"]


def test_kueue_preemption_ends_the_attempt_without_costing_a_restart() -> None:
    job = admitted_running_job()
    job["status"]["progress"] = {"step": 7, "lastCheckpointStep": 5}
    evicted = workload(cond("Evicted", "True", "Preempted", EVICTED))
    job, action = step(job, rec.ClusterChanged(cluster(suspend=True, generation=3)), T1,
                       Observed(workload=evicted))
    s = job["status"]
    assert s["phase"] == "Queued" and s["restarts"] == 0 and s["preemptions"] == 1
    assert s["attempts"][0]["outcome"] == "Preempted"
    assert s["attempts"][0]["lastCheckpointStep"] == 5
    assert EVICTED in s["attempts"][0]["reason"]
    assert s["nextAttempt"] == {"index": 1, "notBefore": T1}  # no backoff
    assert action.delete_ray_cluster == "j-a0"
    assert condition(job, "Queued")["reason"] == "Preempted"
    # The next attempt queues again and resumes from the checkpoint.
    job, action = step(job, rec.BackoffTimer(), T1)
    assert job["status"]["attempt"] == 1 and job["status"]["restarts"] == 0
    assert job["status"]["attempts"][1]["resumedFromStep"] == 5
    assert job["status"]["rayCluster"] == {"name": "j-a1"}  # not admitted yet
    rc = next(c for c in action.children if c["kind"] == "RayCluster")
    assert rc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"


@pytest.mark.parametrize(("retention", "advice"), [("Retain", RETAIN_ADVICE),
                                                   ("Delete", DELETE_ADVICE)])
def test_a_preemption_past_the_last_attempt_number_says_what_re_creating_keeps(
        retention: str, advice: str) -> None:
    job = admitted_running_job()
    job["spec"]["checkpoint"]["retention"] = retention
    job["status"]["attempt"] = MAX_RESTARTS
    job["status"]["attempts"][0]["index"] = MAX_RESTARTS
    evicted = workload(cond("Evicted", "True", "Preempted", EVICTED))
    preempted = cluster(attempt=MAX_RESTARTS, suspend=True, generation=3)
    job, action = step(job, rec.ClusterChanged(preempted), T1, Observed(workload=evicted))
    assert job["status"]["phase"] == "Failed"
    assert f"delete the job and create it again ({advice})" in action.events[0][2]


def test_the_head_deleted_by_kuberay_on_preemption_is_not_a_lost_node() -> None:
    """KubeRay deletes the pods of a cluster Kueue suspended; a pod event may reach the
    operator before the cluster's: the suspended cluster it reads decides."""
    job = admitted_running_job()
    event = rec.PodChanged(head_pod(), deleted=True)
    assert rec.pod_needs_cluster(job, event)
    job, _ = step(job, event, T1, Observed(
        ray_cluster=cluster(suspend=True, generation=3),
        workload=workload(cond("Evicted", "True", "Preempted", EVICTED))))
    assert job["status"]["attempts"][0]["outcome"] == "Preempted"
    assert job["status"]["restarts"] == 0
    # The cluster's own event after it: already recorded, nothing more.
    again = rec.reconcile(job, Observed(), rec.ClusterChanged(cluster(suspend=True,
                                                                      generation=3)), T1, CONFIG)
    assert again.status == {} and not again.events
    # Without a queue, a deleted head is a lost node as before (no extra read).
    plain = new_job(queue=None)
    plain["status"] = {"phase": "Running", "attempt": 0}
    assert not rec.pod_needs_cluster(plain, event)


def test_a_head_that_saved_and_exited_143_on_preemption_stays_preempted() -> None:
    """Kueue's preemption deletes the pods with SIGTERM; the driver commits its last step
    and exits 143 (Terminated). The suspended cluster decides: Preempted, no restart
    counted, not a Terminated restart."""
    job = admitted_running_job()
    pod = head_pod()
    pod["metadata"]["deletionTimestamp"] = T1
    pod["status"] = {"phase": "Failed", "containerStatuses": [{"name": "ray-head", "state": {
        "terminated": {"exitCode": 143, "reason": "Error", "message": json.dumps(
            {"reason": "Terminated", "step": 7, "lastCheckpointStep": 7,
             "detail": "SIGTERM: committed step 7"})}}}]}
    event = rec.PodChanged(pod)
    assert rec.pod_needs_cluster(job, event)
    job, _ = step(job, event, T1, Observed(
        ray_cluster=cluster(suspend=True, generation=3),
        workload=workload(cond("Evicted", "True", "Preempted", EVICTED))))
    assert job["status"]["attempts"][0]["outcome"] == "Preempted"
    assert job["status"]["restarts"] == 0 and job["status"]["preemptions"] == 1


def test_only_queued_clusters_read_their_workload() -> None:
    job, _ = step(queued_job(), rec.SpecChanged())
    assert rec.cluster_needs_workload(job, cluster())
    assert not rec.cluster_needs_pods(job, cluster())  # held: no pods to list
    running = admitted_running_job()
    assert not rec.cluster_needs_workload(running, cluster(suspend=False, state="ready"))
    plain, _ = step(new_job(queue=None), rec.SpecChanged())
    unlabelled = cluster()
    del unlabelled["metadata"]["labels"]["kueue.x-k8s.io/queue-name"]
    assert not rec.cluster_needs_workload(plain, unlabelled)


@pytest.mark.parametrize(("old", "new", "installed", "words"), [
    (None, "team-a", False, "Kueue is not installed"),
    ("team-a", "team-b", True, "spec.queueName cannot change"),
    (None, "Team_A", True, "queueName"),
])
def test_admission_refuses_a_queue_that_cannot_work(old: str | None, new: str,
                                                    installed: bool, words: str) -> None:
    spec = queued_job()["spec"] | {"queueName": new}
    old_spec = None if old is None else spec | {"queueName": old}
    problem = admission_problem(spec, old_spec, kueue_installed=installed)
    assert problem is not None and words in problem
    assert admission_problem(spec | {"queueName": "team-a"}, None, kueue_installed=True) is None


def test_a_cluster_copy_read_before_its_admission_was_seen_is_not_a_preemption() -> None:
    """A Workload event's handler reads the cluster, still suspended; meanwhile the
    cluster's own event (unsuspended) is decided first: the older copy says nothing."""
    job = admitted_running_job()
    stale = cluster(suspend=True, generation=1)
    _, action = step(job, rec.ClusterChanged(stale), T1, Observed(workload=workload()))
    assert action.status == {} and not action.events and action.delete_ray_cluster is None


def test_after_a_preemption_late_events_of_the_ended_attempt_change_nothing() -> None:
    job = admitted_running_job()
    job, _ = step(job, rec.ClusterChanged(cluster(suspend=True, generation=3)), T1,
                  Observed(workload=workload(cond("Evicted", "True", "Preempted", EVICTED))))
    late = [rec.PodChanged(head_pod(), deleted=True),
            rec.ClusterChanged(cluster(suspend=False, state="ready", generation=2))]
    for event in late:
        action = rec.reconcile(job, Observed(pods=[head_pod()]), event, T1, CONFIG)
        assert action.status == {} and not action.events, event


def test_a_checkpoint_committed_after_the_preemption_was_recorded_is_resumed_from() -> None:
    """Kueue suspends the cluster; before KubeRay's SIGTERM reaches the trainer it commits
    and reports step 7. The next attempt starts once the old pods are gone: from step 7."""
    job = admitted_running_job()
    job["status"]["progress"] = {"step": 6, "lastCheckpointStep": 5}
    job, _ = step(job, rec.ClusterChanged(cluster(suspend=True, generation=3)), T1,
                  Observed(workload=workload(cond("Evicted", "True", "Preempted", EVICTED))))
    assert job["status"]["attempts"][0]["lastCheckpointStep"] == 5
    job["status"]["progress"] = {"step": 7, "lastCheckpointStep": 7}  # the trainer's report
    job, _ = step(job, rec.BackoffTimer(), T1)
    assert job["status"]["attempts"][1]["resumedFromStep"] == 7
    assert job["status"]["attempts"][0]["lastCheckpointStep"] == 7
