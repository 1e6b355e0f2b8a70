"""After a node-class failure the next attempt avoids that node (pure): the pod's node is
recorded on the attempt (status.attempts[].node), the next attempt's Ray pods prefer
every other node (a preferred node-affinity term beside the user's own; preferred, so a
pool with no other node still runs the job), and the attempt after that no longer
avoids it."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_api.contract import FailureReason as R
from grpo_api.job.status import GRPOJobStatus
from grpo_operator.reconcile import Action, StoredStatus, read_status
from grpo_operator.reconcile.attempts import ensure_attempt, finish_attempt
from grpo_operator.reconcile.attempts import start_next_attempt as start
from grpo_operator.reconcile.classify import PodOutcome, classify_pod, in_context, worker_outcome
from grpo_operator.reconcile.planning import Planner
from grpo_operator.render import JobRef
from grpo_operator.render.pod_settings import avoiding
from grpo_testbed.examples import example_job
from grpo_testbed.status_patch import apply_status_patch

pytestmark = pytest.mark.unit
JOB = JobRef("j", "ns", "uid-1")
AVOID = {"weight": 100, "preference": {"matchFields": [
    {"key": "metadata.name", "operator": "NotIn", "values": ["gpu-7"]}]}}


def worker_pod(node: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j-a0-workers-x", "labels": {"grpo.dev/role": "worker"}},
            "spec": {"nodeName": node},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "ray-worker", "state": {"running": {}}}], **status}}


def templates(action: Any) -> list[dict[str, Any]]:
    rc = next(c for c in action.children if c["kind"] == "RayCluster")["spec"]
    return [rc["headGroupSpec"]["template"]["spec"],
            *(g["template"]["spec"] for g in rc.get("workerGroupSpecs") or [])]


def preferred_terms(pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    node = (pod_spec.get("affinity") or {}).get("nodeAffinity") or {}
    return list(node.get("preferredDuringSchedulingIgnoredDuringExecution") or [])


def test_a_lost_or_evicted_pod_names_its_node_and_other_ends_do_not() -> None:
    lost = worker_outcome(worker_pod("gpu-7"), deleted=True)
    assert lost is not None and (lost.reason, lost.node) == (R.NODE_LOST, "gpu-7")
    evicted = classify_pod(worker_pod("gpu-7", reason="Evicted", message="disk pressure"))
    assert evicted is not None and (evicted.reason, evicted.node) == (R.EVICTED, "gpu-7")
    oom = worker_outcome(worker_pod("gpu-7", containerStatuses=[{"name": "ray-worker", "state": {
        "terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]))
    assert oom is not None and oom.reason is R.HOST_OOM and oom.node is None
    # The head's NodeLost read with the worker that ended first: that worker's node.
    head = PodOutcome(R.NODE_LOST, 5, "rank 2's actor died", 4, 3)
    assert in_context(head, [worker_pod("gpu-7", phase="Failed", containerStatuses=[
        {"name": "ray-worker", "state": {"terminated": {"exitCode": 1, "reason": "Error"}}}])
    ]).node == "gpu-7"


def test_the_avoidance_is_a_preference_beside_the_users_own_terms() -> None:
    assert avoiding(None, ()) is None
    assert avoiding(None, ("gpu-7",)) == {"nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [AVOID]}}
    zone = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    users = {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [zone]},
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 5, "preference": zone}]},
        "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}
    out = avoiding(users, ("gpu-7",))
    assert out is not None and out["podAntiAffinity"] == users["podAntiAffinity"]
    node = out["nodeAffinity"]
    assert node["requiredDuringSchedulingIgnoredDuringExecution"] == {"nodeSelectorTerms": [zone]}
    assert node["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 5, "preference": zone}, AVOID]
    # The spec's own is not changed.
    assert len(users["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]) == 1


def applied(status: dict[str, Any], action: Action, now: str) -> dict[str, Any]:
    """`status` after the action's patch, derived over it as stored."""
    return apply_status_patch(status, action.derive(read_status(status), 1, now).status)


def test_the_next_attempt_avoids_the_lost_node_and_the_one_after_it_does_not() -> None:
    spec = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]
    spec["backoffLimit"], spec["recovery"] = 3, {"backoff": {"initialSeconds": 0}}
    planner = Planner(spec)
    first = ensure_attempt(JOB, planner.plan([], None), GRPOJobStatus(), "2026-12-03T10:00:00Z")
    assert all(not preferred_terms(t) for t in templates(first))
    status = apply_status_patch({}, first.derive(StoredStatus(), 1, "2026-12-03T10:00:00Z").status)
    lost = PodOutcome(R.NODE_LOST, 5, "worker pod j-a0-workers-x: pod deleted", 4, 3,
                      node="gpu-7")
    ended = finish_attempt(read_status(status).status, lost, "2026-12-03T10:01:00Z", planner)
    status = applied(status, ended, "2026-12-03T10:01:00Z")
    assert status["attempts"][0]["node"] == "gpu-7"
    nxt = start(JOB, planner, read_status(status).status, "2026-12-03T10:02:00Z")
    assert nxt is not None
    for pod_spec in templates(nxt):  # head and workers
        assert preferred_terms(pod_spec) == [AVOID]
    status = applied(status, nxt, "2026-12-03T10:02:00Z")
    # A spec change re-renders the live attempt's children the same way.
    live = read_status(status).status
    again = ensure_attempt(JOB, planner.plan(live.attempts[:-1], None), live,
                           "2026-12-03T10:03:00Z")
    assert all(preferred_terms(t) == [AVOID] for t in templates(again))
    # Attempt 1 ends with an error of the job's own: attempt 2 may use gpu-7 again.
    error = PodOutcome(R.ERROR, 1, "Error at step 6", 6, 5)
    ended = finish_attempt(read_status(status).status, error, "2026-12-03T10:04:00Z", planner)
    status = applied(status, ended, "2026-12-03T10:04:00Z")
    assert "node" not in status["attempts"][1]
    nxt = start(JOB, planner, read_status(status).status, "2026-12-03T10:05:00Z")
    assert nxt is not None and all(not preferred_terms(t) for t in templates(nxt))
