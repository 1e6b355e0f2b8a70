"""The reconcile function: one status patch per event, facts kept in status (pure)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from grpo_operator import reconcile as rec
from grpo_operator.config import OperatorConfig
from grpo_operator.reconcile import Action, Observed
from grpo_testbed.status_patch import apply_status_patch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
T0 = "2026-11-21T10:00:00.000Z"
CONFIG = OperatorConfig(default_image="registry.example/trainer:test")


def new_job(example: str = "grpojob-qwen25vl-7b-a100-40gb.yaml") -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / example).read_text())
    spec = doc["spec"]
    spec["backoffLimit"] = 3
    spec["recovery"] = {"backoff": {"initialSeconds": 30, "maxSeconds": 60}}
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1,
                         "resourceVersion": "1"}, "spec": spec, "status": {}}


def applied(job: dict[str, Any], action: Action) -> dict[str, Any]:
    """The job after the API server merged the action's status patch (RFC 7386) and
    checked the result against the CRD's schema (grpo_testbed.status_patch)."""
    out = copy.deepcopy(job)
    out["status"] = apply_status_patch(out["status"], action.status)
    out["metadata"]["resourceVersion"] = str(int(out["metadata"]["resourceVersion"]) + 1)
    return out


def step(job: dict[str, Any], event: Any, now: str = T0,
         observed: Observed | None = None) -> tuple[dict[str, Any], Action]:
    action = rec.reconcile(job, observed or Observed(), event, now, CONFIG)
    return applied(job, action), action


def pod(role: str, attempt: int = 0, name: str = "p", phase: str = "Running",
        terminated: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    state = {"terminated": terminated} if terminated else {"running": {}}
    return {"metadata": {"name": name, "labels": {"grpo.dev/job": "j",
                                                  "grpo.dev/attempt": str(attempt),
                                                  "grpo.dev/role": role}},
            "status": {"phase": phase, "containerStatuses": [{"name": "ray", "state": state}],
                       **status}}


def cluster(attempt: int = 0, state: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": f"j-a{attempt}", "labels": {"grpo.dev/job": "j",
                                                            "grpo.dev/attempt": str(attempt)}},
            "status": {"state": state} if state else {}}


def running_job() -> dict[str, Any]:
    job, _ = step(new_job(), rec.SpecChanged())
    job, _ = step(job, rec.ClusterChanged(cluster(state="ready")))
    assert job["status"]["phase"] == "Running"
    return job


def test_first_reconcile_writes_status_once_and_names_the_children() -> None:
    job, action = step(new_job(), rec.SpecChanged())
    assert job["status"]["phase"] == "Pending" and job["status"]["attempt"] == 0
    assert [c["kind"] for c in action.children][-1] == "RayCluster"
    rc = action.children[-1]
    image = rc["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "registry.example/trainer:test"  # the configured default image
    # Seen again (operator restart): children re-ensured, nothing new to write.
    again = rec.reconcile(job, Observed(), rec.SpecChanged(), "2026-11-21T10:05:00Z", CONFIG)
    assert again.children and again.status == {}  # one builder: a write only on a change
    running = running_job()
    assert rec.reconcile(running, Observed(), rec.SpecChanged(), "2026-11-21T10:05:00Z",
                         CONFIG).status == {}


def test_a_ready_ray_cluster_makes_the_job_running_once() -> None:
    job, _ = step(new_job(), rec.SpecChanged())
    job, action = step(job, rec.ClusterChanged(cluster(state="ready")))
    assert job["status"]["phase"] == "Running"
    assert job["status"]["rayCluster"] == {"name": "j-a0", "state": "ready"}
    assert [e[1] for e in action.events] == ["Running"]
    _, again = step(job, rec.ClusterChanged(cluster(state="ready")))
    assert again == Action()


def test_a_cluster_not_ready_yet_shows_what_its_pods_wait_for() -> None:
    job, _ = step(new_job(), rec.SpecChanged())
    rc = cluster()
    assert rec.cluster_needs_pods(job, rc)
    stuck = pod("worker", phase="Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "message": "0/5 nodes: Insufficient gpu"}])
    job, _ = step(job, rec.ClusterChanged(rc), observed=Observed(pods=[pod("head"), stuck]))
    progressing = next(c for c in job["status"]["conditions"] if c["type"] == "Progressing")
    assert job["status"]["phase"] == "Pending" and progressing["reason"] == "Unschedulable"
    assert not rec.cluster_needs_pods(job, cluster(state="ready"))
    assert not rec.cluster_needs_pods(job, cluster(attempt=1))  # not this attempt's cluster


def test_workers_waiting_20_minutes_for_capacity_are_a_phase_not_a_restart() -> None:
    """The trainer waits for nodes that have not joined with no deadline (placement.py);
    the operator shows why and never ends the attempt for it: 20 minutes later it is
    still attempt 0, Pending, Unschedulable, with no outcome recorded."""
    job, _ = step(new_job(), rec.SpecChanged())
    stuck = pod("worker", name="j-a0-workers-b", phase="Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/5 nodes are available: 5 Insufficient nvidia.com/gpu"}])
    pods = [pod("head", name="j-a0-head"), stuck]
    job, _ = step(job, rec.ClusterChanged(cluster()), observed=Observed(pods=pods))
    assert not rec.progress_watched(job)  # no progress deadline runs while it waits
    for minute in (1, 10, 20):
        now = f"2026-11-21T10:{minute:02d}:00.000Z"
        job, _ = step(job, rec.PodChanged(stuck), now, Observed(pods=pods))
        job, _ = step(job, rec.ClusterChanged(cluster()), now, Observed(pods=pods))
        job, _ = step(job, rec.ProgressTimer(), now, Observed(pods=pods))
    st = job["status"]
    progressing = next(c for c in st["conditions"] if c["type"] == "Progressing")
    assert st["phase"] == "Pending" and st["attempt"] == 0
    assert progressing["reason"] == "Unschedulable"
    assert "j-a0-workers-b cannot be scheduled: 0/5 nodes are available" in \
        progressing["message"]
    assert [a.get("outcome") for a in st["attempts"]] == ["Running"]  # live: never ended


def test_only_pod_events_that_can_change_the_job_cost_a_read() -> None:
    assert rec.pod_matters(rec.PodChanged(pod("head")))  # running: the job may be Running now
    assert not rec.pod_matters(rec.PodChanged(pod("worker", phase="Pending")))
    assert rec.pod_matters(rec.PodChanged(pod("head"), deleted=True))  # node lost
    ended = {"exitCode": 3, "reason": "Error"}
    assert rec.pod_matters(rec.PodChanged(pod("head", phase="Failed", terminated=ended)))
    assert rec.pod_matters(rec.PodChanged(pod("worker", phase="Failed", terminated=ended)))


def test_running_pods_make_the_job_running_before_kuberay_updates_its_cluster() -> None:
    job, _ = step(new_job(), rec.SpecChanged())
    head, worker = pod("head"), pod("worker", phase="Pending", name="w")
    event = rec.PodChanged(head)
    assert rec.pod_needs_pods(job, event)
    job, action = step(job, event, observed=Observed(pods=[head, worker]))
    assert job["status"]["phase"] == "Starting" and not action.events
    pods = [head, pod("worker", name="w")]
    job, action = step(job, rec.PodChanged(pods[1]), observed=Observed(pods=pods))
    assert job["status"]["phase"] == "Running" and action.events[0][1] == "Running"
    assert not rec.pod_needs_pods(job, event)  # Running already: one read, no list


def test_an_oom_killed_worker_pod_ends_the_attempt_as_host_oom_and_runs_the_ladder() -> None:
    job = running_job()
    ended = pod("worker", name="j-a0-workers-x", phase="Failed",
                terminated={"exitCode": 137, "reason": "OOMKilled"})
    assert rec.pod_matters(rec.PodChanged(ended))
    job, action = step(job, rec.PodChanged(ended))
    record = job["status"]["attempts"][0]
    assert job["status"]["phase"] == "Restarting" and action.restart_reason == "HostOOM"
    assert record["outcome"] == "HostOOM" and "j-a0-workers-x" in record["reason"]
    assert record["remediation"].startswith("HostOOM: ")  # the host-memory ladder ran
    assert action.delete_ray_cluster == "j-a0"
    # The driver's exit 5 that follows (its ranks died with the pod) changes nothing.
    head = pod("head", phase="Failed", terminated={"exitCode": 5, "reason": "Error"})
    assert step(job, rec.PodChanged(head))[1] == Action()


def test_a_head_that_lost_its_ranks_takes_the_class_of_the_worker_that_died_first() -> None:
    job = running_job()
    msg = '{"reason": "NodeLost", "step": 7, "lastCheckpointStep": 6, "detail": "actor died"}'
    head = pod("head", phase="Failed", terminated={"exitCode": 5, "message": msg})
    oomed = pod("worker", name="j-a0-workers-y", phase="Failed",
                terminated={"exitCode": 137, "reason": "OOMKilled"})
    event = rec.PodChanged(head)
    assert rec.pod_needs_pods(job, event)  # the head's loss asks what its workers show
    job, action = step(job, event, observed=Observed(pods=[head, pod("worker"), oomed]))
    record = job["status"]["attempts"][0]
    assert record["outcome"] == "HostOOM" and action.restart_reason == "HostOOM"
    assert "j-a0-workers-y" in record["reason"] and "actor died" in record["reason"]
    assert record["step"] == 7 and record["lastCheckpointStep"] == 6
    # With every worker still running, the head's own class stands.
    lone, _ = step(running_job(), event, observed=Observed(pods=[head, pod("worker")]))
    assert lone["status"]["attempts"][0]["outcome"] == "NodeLost"


def test_ranks_that_never_joined_are_named_with_what_their_pods_wait_for() -> None:
    """The driver knows only that 1 of 2 nodes joined; the operator adds why: the
    missing worker pod's scheduling or image-pull reason."""
    job = running_job()
    msg = ('{"reason": "WorkersMissing", "step": 0, "detail": "only 1 of 2 nodes joined '
           'within 600 s"}')
    head = pod("head", phase="Failed", terminated={"exitCode": 5, "message": msg})
    pending = pod("worker", name="j-a0-workers-b", phase="Pending", conditions=[
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/5 nodes are available: 5 Insufficient nvidia.com/gpu"}])
    pulling = pod("worker", name="j-a0-workers-c", phase="Pending")
    pulling["status"]["containerStatuses"] = [{"name": "ray", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]
    event = rec.PodChanged(head)
    assert rec.pod_needs_pods(job, event)
    job, action = step(job, event, observed=Observed(
        pods=[head, pod("worker", name="j-a0-workers-a"), pending, pulling]))
    record = job["status"]["attempts"][0]
    assert record["outcome"] == "WorkersMissing" and action.restart_reason == "WorkersMissing"
    assert "only 1 of 2 nodes joined" in record["reason"]
    assert "j-a0-workers-b Unschedulable: 0/5 nodes are available" in record["reason"]
    assert "j-a0-workers-c ImagePullBackOff" in record["reason"]
    assert "j-a0-workers-a" not in record["reason"]  # running: it joined


def test_a_worker_deleted_while_it_ran_is_a_lost_node_one_that_never_ran_is_nothing() -> None:
    job = running_job()
    never_ran = pod("worker", name="w0", phase="Pending")
    never_ran["status"]["containerStatuses"] = [{"name": "ray", "state": {"waiting": {}}}]
    assert not rec.pod_matters(rec.PodChanged(never_ran, deleted=True))
    assert step(job, rec.PodChanged(never_ran, deleted=True))[1] == Action()
    job, action = step(job, rec.PodChanged(pod("worker", name="w1"), deleted=True))
    assert job["status"]["attempts"][0]["outcome"] == "NodeLost"
    assert action.restart_reason == "NodeLost" and "w1" in job["status"]["attempts"][0]["reason"]


def test_head_failure_restarts_after_the_backoff_and_measures_recovery_from_status() -> None:
    job = running_job()
    msg = '{"reason": "CudaOOM", "step": 12, "lastCheckpointStep": 10}'
    head = pod("head", phase="Failed", terminated={"exitCode": 3, "message": msg})
    job, action = step(job, rec.PodChanged(head))
    assert job["status"]["phase"] == "Restarting" and action.restart_reason == "CudaOOM"
    assert action.delete_ray_cluster == "j-a0"
    # Pods and the cluster of the failed attempt say nothing while it waits.
    assert step(job, rec.PodChanged(head))[1] == Action()
    assert step(job, rec.ClusterChanged(cluster(state="ready")))[1] == Action()
    assert step(job, rec.BackoffTimer(), "2026-11-21T10:00:29.000Z")[1] == Action()
    job, action = step(job, rec.BackoffTimer(), "2026-11-21T10:00:31.500Z")
    assert job["status"]["attempt"] == 1 and job["status"]["phase"] == "Pending"
    assert action.recovered_after == 31.5  # from attempts[0].endTime, not process memory
    assert [c["metadata"]["name"] for c in action.children] == ["j-config-1", "j-a1"]


def test_the_next_attempt_waits_for_the_failed_attempts_pods_to_be_gone() -> None:
    """Two drivers of one job never overlap: KubeRay may already have started a
    replacement head for the failed attempt; attempt 1 starts once it is gone."""
    job = running_job()
    head = pod("head", phase="Failed", terminated={"exitCode": 137, "reason": "OOMKilled"})
    job, _ = step(job, rec.PodChanged(head))
    due = "2026-11-21T10:00:31.000Z"
    assert not rec.restart_due(job, "2026-11-21T10:00:29.000Z") and rec.restart_due(job, due)
    replacement = pod("head", name="j-a0-head-new")  # running, attempt 0
    waiting, action = step(job, rec.BackoffTimer(), due,
                           observed=Observed(pods=[head, replacement]))
    progressing = next(c for c in waiting["status"]["conditions"]
                       if c["type"] == "Progressing")
    assert waiting["status"]["phase"] == "Restarting" and not action.children
    assert progressing["reason"] == "WaitingForPreviousAttempt"
    assert "j-a0-head-new" in progressing["message"] and "OOMKilled" not in progressing["message"]
    again = rec.reconcile(waiting, Observed(pods=[replacement]), rec.BackoffTimer(),
                          "2026-11-21T10:00:32.000Z", CONFIG)
    assert again == Action()  # nothing new to say: no write per tick
    started, action = step(waiting, rec.BackoffTimer(), "2026-11-21T10:00:33.000Z",
                           observed=Observed(pods=[head]))  # only the ended head is left
    assert started["status"]["attempt"] == 1 and action.children
    # A pod that will not go (a lost node) holds the restart for the grace period only.
    late = rec.reconcile(waiting, Observed(pods=[replacement]), rec.BackoffTimer(),
                         "2026-11-21T10:02:32.000Z", CONFIG)
    assert late.children and "PreviousAttemptLingers" in [e[1] for e in late.events]


def test_a_job_being_deleted_gets_nothing_created() -> None:
    job = running_job()
    job["metadata"]["deletionTimestamp"] = T0
    job["status"]["nextAttempt"] = {"index": 1, "notBefore": T0}
    ready = rec.ClusterChanged(cluster(state="ready"))
    for event in (rec.SpecChanged(), rec.BackoffTimer(), ready):
        assert rec.reconcile(job, Observed(), event, "2026-11-21T11:00:00Z", CONFIG) == Action()


def test_a_missing_claim_is_a_condition_and_a_retry() -> None:
    job = new_job()
    job["spec"]["checkpoint"] = {"claimName": "absent"}
    job, action = step(job, rec.SpecChanged())
    assert job["status"]["phase"] == "Pending" and not action.children
    progressing = next(c for c in job["status"]["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "ClaimMissing"
    assert action.retry is not None and "absent" in action.retry[0]
    _, again = step(job, rec.SpecChanged())
    assert again.status == {} and again.retry  # same condition: nothing to write


def test_the_trainers_growth_report_sets_the_condition_once() -> None:
    job = running_job()
    job["status"]["progress"] = {"step": 3, "memoryGrowth": "RSS grew 4 MB/step"}
    job, action = step(job, rec.JobChanged())
    growth = next(c for c in job["status"]["conditions"] if c["type"] == "MemoryGrowth")
    assert growth["status"] == "True" and action.events[0][1] == "MemoryGrowth"
    assert step(job, rec.JobChanged())[1] == Action()


def test_a_refused_child_is_a_create_failed_status_an_event_and_a_retry() -> None:
    job, _ = step(new_job(), rec.SpecChanged())
    refused = rec.CreateFailed("ConfigMap", "j-config-0", "403 Forbidden: exceeded quota")
    job, action = step(job, refused)
    assert job["status"]["phase"] == "Pending" and not action.children
    degraded = next(c for c in job["status"]["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "CreateFailed"
    assert "exceeded quota" in degraded["message"]
    assert action.events == [("Warning", "CreateFailed", degraded["message"])]
    assert action.retry is not None and action.retry[1] > 0


def test_the_hub_fetch_report_sets_the_hubfetch_condition_once() -> None:
    job = running_job()
    job["status"]["progress"] = {"fetch": {"repo": "acme/m", "file": "", "bytesDone": 2**30,
                                           "bytesTotal": 2**30, "state": "Fetched"}}
    job, action = step(job, rec.JobChanged())
    fetch = next(c for c in job["status"]["conditions"] if c["type"] == "HubFetch")
    assert fetch["status"] == "True" and fetch["reason"] == "Fetched" and not action.events
    assert step(job, rec.JobChanged())[1] == Action()


def test_the_configured_gpu_catalog_is_the_one_planned_with() -> None:
    from grpo_operator.catalog_file import merge_catalog

    job = new_job()
    job["spec"]["resources"]["gpuType"] = "A100-40GB-X"
    failed = rec.reconcile(job, Observed(), rec.SpecChanged(), T0, CONFIG)
    assert failed.status["phase"] == "Failed" and not failed.children  # not in the built-in
    a100 = {"memoryGiB": 39.4, "productLabel": "NVIDIA-A100-SXM4-40GB-X",
            "hostMemoryGiB": 1007, "cpus": 240, "gpusPerNode": 8}
    config = OperatorConfig(catalog=merge_catalog({"A100-40GB-X": a100}))
    action = rec.reconcile(job, Observed(), rec.SpecChanged(), T0, config)
    assert action.status["phase"] == "Pending" and action.children


def test_the_restart_timer_runs_for_a_backoff_but_not_for_a_job_being_deleted() -> None:
    # Deleting a namespace deletes the head pod first, which reads as a failure and
    # schedules a restart; the timer must not then try to create in a dying namespace.
    waiting = {"metadata": {"name": "j"}, "status": {"nextAttempt": {"index": 1}}}
    assert rec.restart_pending(waiting)
    deleting = copy.deepcopy(waiting)
    deleting["metadata"]["deletionTimestamp"] = "2026-11-23T11:36:00Z"
    assert not rec.restart_pending(deleting)
    assert not rec.restart_pending({"metadata": {"name": "j"}, "status": {"phase": "Running"}})


def test_a_head_pod_deleted_with_its_namespace_starts_no_restart() -> None:
    job = running_job()
    gone = rec.PodChanged(pod("head"), deleted=True)
    assert step(job, gone)[0]["status"]["phase"] == "Restarting"  # a node loss
    _, action = step(job, gone, observed=Observed(namespace_terminating=True))
    assert action == Action()


def test_a_claim_one_node_cannot_share_holds_the_job_pending_even_with_nodes_unset() -> None:
    """The planner resolves nodes; a head and its workers all mount the claims."""
    job = new_job("grpojob-qwen25vl-7b-h100.yaml")
    del job["spec"]["resources"]["nodes"]
    job["spec"]["checkpoint"] = {"claimName": "ckpt"}
    job["spec"]["model"] = {**job["spec"]["model"], "claimName": "weights"}
    rwo, rox = ({"spec": {"accessModes": [m]}} for m in ("ReadWriteOnce", "ReadOnlyMany"))
    rwx = {"spec": {"accessModes": ["ReadWriteMany"]}}
    _, held = step(job, rec.SpecChanged(), observed=Observed(claim=rwo, model_claim=rox))
    assert held.status["phase"] == "Pending" and not held.children and held.retry
    assert held.events[0][1] == "ClaimMissing" and "checkpoint.claimName 'ckpt'" in (
        held.events[0][2])
    _, held = step(job, rec.SpecChanged(), observed=Observed(claim=rwx, model_claim=rwo))
    assert not held.children and "model.claimName 'weights' is ReadWriteOnce" in (
        held.events[0][2])
    _, ok = step(job, rec.SpecChanged(), observed=Observed(claim=rwx, model_claim=rox))
    assert ok.children and ok.status["phase"] == "Pending"


def test_a_measured_peak_past_the_plan_turns_memory_plan_underestimated_once() -> None:
    """The trainer's readings against status.plan.peaks (as the planner wrote them): within
    -> True; a GPU stage past it -> False, by how much, with one Warning event; a reading
    of an earlier attempt is not held to this attempt's plan."""
    job = running_job()
    planned = job["status"]["plan"]["peaks"]
    rollout = planned["gpuGiB"]["rollout"]
    job["status"]["progress"] = {"step": 2, "measuredPeaks": {
        "attempt": 0, "step": 2, "gpuGiB": {"rollout": rollout - 1.0, "training": 5.0},
        "hostRankGiB": 1.5}}
    job, action = step(job, rec.JobChanged())
    plan_cond = next(c for c in job["status"]["conditions"] if c["type"] == "MemoryPlan")
    assert (plan_cond["status"], plan_cond["reason"]) == ("True", "WithinPlan")
    assert not action.events
    job["status"]["progress"]["measuredPeaks"]["gpuGiB"]["rollout"] = rollout + 2.5
    job["status"]["progress"]["measuredPeaks"]["step"] = 3
    job, action = step(job, rec.JobChanged())
    plan_cond = next(c for c in job["status"]["conditions"] if c["type"] == "MemoryPlan")
    assert (plan_cond["status"], plan_cond["reason"]) == ("False", "Underestimated")
    assert f"GPU rollout: measured {rollout + 2.5:.1f} GiB, planned {rollout:.1f} GiB, " \
        "2.5 GiB over" in plan_cond["message"] and "step 3" in plan_cond["message"]
    assert action.events == [("Warning", "Underestimated", plan_cond["message"])]
    job["status"]["progress"]["measuredPeaks"]["gpuGiB"]["rollout"] = rollout + 3.5
    job, action = step(job, rec.JobChanged())  # grows further: the message, no new event
    assert action.events == [] and "3.5 GiB over" in next(
        c for c in job["status"]["conditions"] if c["type"] == "MemoryPlan")["message"]
    job["status"]["progress"]["measuredPeaks"]["attempt"] = 1  # not this attempt's plan
    job["status"]["progress"]["measuredPeaks"]["gpuGiB"]["rollout"] = rollout - 1.0
    assert step(job, rec.JobChanged())[1] == Action()
