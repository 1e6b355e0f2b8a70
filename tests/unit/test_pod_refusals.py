"""Ray pods the API server refuses: the job shows KubeRay's record of the refusal at once
(Pending, Progressing/Degraded PodCreateRefused, the admission message, one Warning
event) and fails after the deadline instead of waiting forever (pure)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_operator import reconcile as rec
from grpo_operator.config import OperatorConfig
from grpo_operator.reconcile import Action, Observed
from grpo_operator.reconcile.refusals import Refusal, pod_create_refusal, refusal_pending
from grpo_operator.reconcile.retention import DELETE_ADVICE, RETAIN_ADVICE
from grpo_testbed.status_patch import apply_status_patch

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/grpojob-qwen25vl-7b-h100.yaml"
CONFIG = OperatorConfig(default_image="img", pod_create_deadline_seconds=300)
T0 = "2026-11-24T10:00:00.000Z"
ADMISSION = ('pods "j-a0-head-x7k2p" is forbidden: violates PodSecurity "restricted:latest": '
             'allowPrivilegeEscalation != false (container "ray-head" must set '
             "securityContext.allowPrivilegeEscalation=false)")
LIMIT_RANGE = ('pods "j-a0-head-xcpkt" is forbidden: maximum memory usage per Container is '
               "1Gi, but limit is 13Gi")
QUOTA = ('pods "j-a0-workers-worker-4zq9d" is forbidden: exceeded quota: pods, requested: '
         "pods=1, used: pods=1, limited: pods=1")


def ray_cluster(*conditions: dict[str, Any], attempt: int = 0) -> dict[str, Any]:
    """A RayCluster as the real KubeRay v1.6.1 writes it while it cannot create the head
    pod (dumped from the testbed, tests/cluster/test_pod_admission.py)."""
    since = "2026-11-24T09:59:58Z"
    return {"apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": f"j-a{attempt}", "namespace": "ns",
                         "labels": {"grpo.dev/job": "j", "grpo.dev/attempt": str(attempt)}},
            "status": {"conditions": [
                *conditions,
                {"type": "HeadPodReady", "status": "False", "reason": "HeadPodNotFound",
                 "message": "Head Pod not found", "lastTransitionTime": since},
                {"type": "RayClusterProvisioned", "status": "False",
                 "reason": "RayClusterPodsProvisioning",
                 "message": "RayCluster Pods are being provisioned for first time",
                 "lastTransitionTime": since},
                {"type": "RayClusterSuspended", "status": "False",
                 "reason": "RayClusterSuspended", "message": "", "lastTransitionTime": since},
                {"type": "RayClusterSuspending", "status": "False",
                 "reason": "RayClusterSuspending", "message": "",
                 "lastTransitionTime": since}],
                "desiredCPU": "2", "desiredGPU": "0", "desiredMemory": "13Gi",
                "desiredTPU": "0", "endpoints": {"client": "10001", "dashboard": "8265",
                                                 "gcs-server": "6379", "metrics": "8080",
                                                 "serve": "8000"},
                "head": {"serviceName": f"j-a{attempt}-head-svc"},
                "lastUpdateTime": "2026-11-24T09:59:59Z", "observedGeneration": 1}}


def failure(reason: str, message: str, since: str = "2026-11-24T09:59:59Z"
            ) -> dict[str, Any]:
    """KubeRay's ReplicaFailure condition: errors.Join(marker, the API server's error)."""
    return {"type": "ReplicaFailure", "status": "True", "reason": reason,
            "message": f"{reason}\n{message}", "lastTransitionTime": since}


def job(**checkpoint: Any) -> dict[str, Any]:
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    spec["checkpoint"] = {**spec["checkpoint"], **checkpoint}
    out = {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
           "metadata": {"name": "j", "namespace": "ns", "uid": "u", "generation": 1,
                        "resourceVersion": "1"}, "spec": spec, "status": {}}
    return applied(out, rec.reconcile(out, Observed(), rec.SpecChanged(), T0, CONFIG))


def applied(j: dict[str, Any], action: Action) -> dict[str, Any]:
    out = copy.deepcopy(j)
    out["status"] = apply_status_patch(out["status"], action.status)  # as the API server
    return out


def cluster_event(j: dict[str, Any], rc: dict[str, Any], now: str) -> Action:
    return rec.reconcile(j, Observed(), rec.ClusterChanged(rc), now, CONFIG)


def conditions(j: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in j["status"]["conditions"]}


def test_kuberays_refusal_record_is_read_with_the_admission_message_and_since() -> None:
    assert pod_create_refusal(ray_cluster(failure("FailedCreateHeadPod", ADMISSION))) == \
        Refusal("head", ADMISSION, "2026-11-24T09:59:59Z")
    assert pod_create_refusal(ray_cluster(failure("FailedCreateHeadPod", LIMIT_RANGE))) == \
        Refusal("head", LIMIT_RANGE, "2026-11-24T09:59:59Z")
    assert pod_create_refusal(ray_cluster(failure("FailedCreateWorkerPod", QUOTA))) == \
        Refusal("worker", QUOTA, "2026-11-24T09:59:59Z")
    # Not a create refusal: a failed delete, a cleared condition, no condition at all.
    assert pod_create_refusal(ray_cluster(failure("FailedDeleteHeadPod", "boom"))) is None
    cleared = failure("FailedCreateHeadPod", ADMISSION) | {"status": "False"}
    assert pod_create_refusal(ray_cluster(cleared)) is None
    assert pod_create_refusal(ray_cluster()) is None


def test_a_refused_head_shows_at_once_with_one_warning_then_fails_at_the_deadline() -> None:
    j = job()
    rc = ray_cluster(failure("FailedCreateHeadPod", ADMISSION))
    first = cluster_event(j, rc, "2026-11-24T10:00:01.000Z")
    j = applied(j, first)
    assert j["status"]["phase"] == "Pending"
    conds = conditions(j)
    for kind in ("Progressing", "Degraded"):
        assert conds[kind]["status"] == "True"
        assert conds[kind]["reason"] == "PodCreateRefused"
        assert ADMISSION in conds[kind]["message"]
    assert "2026-11-24T10:04:59Z" in conds["Progressing"]["message"]  # when it fails
    assert [(k, r) for k, r, _ in first.events] == [("Warning", "PodCreateRefused")]
    assert refusal_pending(j)

    # The same refusal seen again (KubeRay retrying, the deadline timer): nothing new.
    again = cluster_event(j, rc, "2026-11-24T10:02:00.000Z")
    assert again == Action()

    # A different message (the next pod's name) updates the condition, no second event.
    other = ray_cluster(failure("FailedCreateHeadPod", ADMISSION.replace("x7k2p", "q1w2e")))
    changed = cluster_event(j, other, "2026-11-24T10:03:00.000Z")
    assert "q1w2e" in conditions(applied(j, changed))["Degraded"]["message"]
    assert changed.events == []

    ended = cluster_event(j, rc, "2026-11-24T10:05:00.000Z")
    j = applied(j, ended)
    assert j["status"]["phase"] == "Failed"
    failed = conditions(j)["Failed"]
    assert failed["status"] == "True" and failed["reason"] == "PodCreateRefused"
    assert ADMISSION in failed["message"] and "Pod Security" in failed["message"]
    assert ended.delete_ray_cluster == "j-a0"  # KubeRay stops trying
    assert [(k, r) for k, r, _ in ended.events] == [("Warning", "PodCreateRefused")]
    (attempt,) = j["status"]["attempts"]
    assert attempt["outcome"] == "Error" and ADMISSION in attempt["reason"]
    assert not refusal_pending(j)
    # Terminal: later cluster events change nothing.
    assert cluster_event(j, rc, "2026-11-24T10:06:00.000Z") == Action()


def test_the_deadline_is_the_operators_setting() -> None:
    short = OperatorConfig(default_image="img", pod_create_deadline_seconds=5)
    rc = ray_cluster(failure("FailedCreateWorkerPod", QUOTA, since="2026-11-24T10:00:00Z"))
    action = rec.reconcile(job(), Observed(), rec.ClusterChanged(rc),
                           "2026-11-24T10:00:06.000Z", short)
    assert action.status["phase"] == "Failed"
    assert "worker pod of RayCluster j-a0 for 6 s" in action.events[0][2]


@pytest.mark.parametrize(("checkpoint", "advice"), [({}, RETAIN_ADVICE),
                                                    ({"retention": "Delete"}, DELETE_ADVICE)])
def test_the_failure_says_what_deleting_the_job_does_to_its_checkpoints(
        checkpoint: dict[str, Any], advice: str) -> None:
    """It sends the user to delete the job: a Delete job must not read that its
    checkpoints are kept."""
    rc = ray_cluster(failure("FailedCreateWorkerPod", QUOTA, since="2026-11-24T10:00:00Z"))
    action = cluster_event(job(**checkpoint), rc, "2026-11-24T10:05:01.000Z")
    assert action.status["phase"] == "Failed"
    assert f"delete the job and create it again ({advice})" in action.events[0][2]


def test_once_kuberay_creates_the_pods_the_refusal_clears() -> None:
    j = job()
    j = applied(j, cluster_event(j, ray_cluster(failure("FailedCreateHeadPod", QUOTA)),
                                 "2026-11-24T10:00:01.000Z"))
    fixed = ray_cluster() | {"status": {"state": "ready"}}
    j = applied(j, cluster_event(j, fixed, "2026-11-24T10:01:00.000Z"))
    assert j["status"]["phase"] == "Running"
    assert conditions(j)["Degraded"]["status"] == "False"
    assert not refusal_pending(j)


def test_a_running_job_is_not_failed_by_a_refused_replacement_pod() -> None:
    j = job()
    j = applied(j, cluster_event(j, ray_cluster() | {"status": {"state": "ready"}}, T0))
    assert j["status"]["phase"] == "Running"
    refused = ray_cluster(failure("FailedCreateWorkerPod", QUOTA, since="2026-11-24T09:00:00Z"))
    refused["status"]["state"] = "ready"
    assert cluster_event(j, refused, "2026-11-24T10:30:00.000Z").status.get("phase") in (
        None, "Running")


def test_a_refusal_of_an_earlier_attempts_cluster_is_ignored() -> None:
    rc = ray_cluster(failure("FailedCreateHeadPod", ADMISSION), attempt=3)
    assert cluster_event(job(), rc, "2026-11-24T11:00:00.000Z") == Action()


def test_a_refused_worker_stays_shown_while_the_head_runs() -> None:
    """The head's pod events must not turn a worker's refusal into a silent Starting."""
    j = job()
    rc = ray_cluster(failure("FailedCreateWorkerPod", QUOTA))
    j = applied(j, cluster_event(j, rc, "2026-11-24T10:00:01.000Z"))
    assert conditions(j)["Progressing"]["reason"] == "PodCreateRefused"
    head = {"metadata": {"name": "j-a0-head-x", "labels": {
        "grpo.dev/job": "j", "grpo.dev/attempt": "0", "grpo.dev/role": "head"}},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": "ray-head", "state": {"running": {}}}]}}
    action = rec.reconcile(j, Observed(pods=[head]), rec.PodChanged(head),
                           "2026-11-24T10:00:02.000Z", CONFIG)
    assert action == Action() and refusal_pending(j)
