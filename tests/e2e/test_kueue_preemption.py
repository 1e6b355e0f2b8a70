"""Kueue preempts a training GRPOJob for real, a drain evicts its worker pod, and each
time it resumes from the step the trainer had finished.

On the real node, with the real Kueue and KubeRay, the trainer image and the operator
running in the cluster as the chart deploys it (so the chart's Kueue RBAC is what it has): a
ClusterQueue with CPU for one tiny job; the tiny job (low priority, a Ray head and a
worker pod, no interval checkpoint before its last step) trains; an urgent job (high
priority) arrives, Kueue suspends the tiny job's RayCluster and KubeRay deletes its pods:
the driver gets SIGTERM and commits its last finished step while the worker pod's preStop
hook keeps Ray there up. The operator records the attempt as Preempted without counting a
restart; the urgent job runs to the end; Kueue readmits the tiny job, whose next attempt
resumes from that step. Then its worker pod is evicted through the Eviction API, as
`kubectl drain` does: the operator ends the attempt at once, and the driver saves on the
SIGTERM that follows. The next attempt's worker pod is deleted plainly (`kubectl delete
pod`): the operator waits for the pod to end, so only the pod's preStop hook tells the
driver, which saves and stops. Each attempt resumes from the step saved before it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from grpo_api.contract import ATTEMPT_LABEL, JOB_LABEL, ROLE_LABEL, Role
from grpo_testbed.tiny_job import (
    JOB,
    JOB_NS,
    TERMINAL,
    TinyJob,
    example,
    multipod_example,
    tiny_job_testbed,
)

pytestmark = pytest.mark.e2e

# The preemption, the eviction and the delete must each land mid-run. A step takes
# ~0.35 s on 2 cores (2026-11-29, micro-batches by tokens), and each disruption lets
# about 55 steps pass between the watch seeing a step and the driver being told
# (progress reports are rate-limited; the operator, KubeRay, the kubelet act in turn):
# 60 steps, enough at 0.8 s a step, let attempt 2 finish before its delete landed.
STEPS = 200
NO_INTERVAL = 1000  # only a stop's save (and the last step's) checkpoints before the end
URGENT = "urgent"
PRIORITIES = {"grpo-low": 100, "grpo-high": 1000}
QUEUE = "grpo"


def queues(cpus: str) -> list[dict[str, Any]]:
    """A ClusterQueue with CPU for one tiny job at a time, and its LocalQueue."""
    return [
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
         "metadata": {"name": "grpo-cpu"},
         "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                  "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [
                      {"name": "default-flavor", "resources": [
                          {"name": "cpu", "nominalQuota": cpus},
                          {"name": "memory", "nominalQuota": "64Gi"}]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
         "metadata": {"name": QUEUE, "namespace": JOB_NS}, "spec": {"clusterQueue": "grpo-cpu"}},
        *({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
           "metadata": {"name": name}, "value": value} for name, value in PRIORITIES.items()),
    ]


def queued_job(name: str, priority: str, doc: dict[str, Any]) -> dict[str, Any]:
    doc["metadata"] = {"name": name, "namespace": JOB_NS}
    spec = doc["spec"]
    spec["queueName"] = QUEUE
    spec["pods"] = {"common": {"priorityClassName": priority}}
    return doc


def urgent_job() -> dict[str, Any]:
    doc = example()  # head-only, the same 2 CPUs as the tiny job's head and worker
    doc["spec"]["training"]["maxSteps"] = 2
    return queued_job(URGENT, "grpo-high", doc)


def worker_pod(tj: TinyJob, attempt: int) -> str:
    pods = json.loads(tj.tb.kubectl(
        "get", "pods", "-n", JOB_NS, "-l",
        f"{JOB_LABEL}={JOB},{ATTEMPT_LABEL}={attempt},{ROLE_LABEL}={Role.WORKER.value}",
        "-o", "json").stdout)["items"]
    (pod,) = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return str(pod["metadata"]["name"])


def evict_worker(tj: TinyJob, attempt: int) -> str:
    """What `kubectl drain` does to the pod: the Eviction API (a DisruptionTarget
    condition, then the delete with the pod's grace period and its preStop hook)."""
    name = worker_pod(tj, attempt)
    eviction = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": name, "namespace": JOB_NS}}
    tj.tb.kubectl("create", "--raw", f"/api/v1/namespaces/{JOB_NS}/pods/{name}/eviction",
                  "-f", "-", input=json.dumps(eviction))
    return name


def delete_worker(tj: TinyJob, attempt: int) -> str:
    name = worker_pod(tj, attempt)
    tj.tb.kubectl("delete", "pod", name, "-n", JOB_NS, "--wait=false")
    return name


def committed_on_stop(log: str) -> int:
    """The step the driver saved when told to stop (its SIGTERM, or a drained pod's hook)."""
    found = re.findall(r": committed a checkpoint of step (\d+), [0-9.]+ s after the signal", log)
    assert found, log[-3000:]
    return int(found[-1])


def resumed_past(attempt: int) -> Any:
    """The tiny job's attempt ``attempt`` has finished a step after the one it resumed from."""
    def check(job: dict[str, Any]) -> bool:
        st = job.get("status") or {}
        record = next((a for a in st.get("attempts") or [] if a.get("index") == attempt), {})
        if st.get("attempt") != attempt or record.get("resumedFromStep") is None:
            return False
        return int((st.get("progress") or {}).get("step") or 0) > record["resumedFromStep"]
    return check


@dataclass(frozen=True)
class Drained:
    tj: TinyJob
    evicted: str  # attempt 1's worker pod
    deleted: str  # attempt 2's


def status(tj: TinyJob, name: str) -> dict[str, Any]:
    out = tj.tb.kubectl("get", "grpojob", name, "-n", JOB_NS, "-o", "json")
    return dict(json.loads(out.stdout).get("status") or {})


def kueue_flavors() -> str:
    exe = shutil.which("grpo", path=str(Path(sys.executable).parent))
    assert exe, "the grpo CLI is installed with the operator package"
    return subprocess.run([exe, "kueue-flavors"], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture(scope="module")
def drained(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Drained]:
    work = tmp_path_factory.mktemp("kueue")
    with tiny_job_testbed(work) as tj:
        tb = tj.tb
        try:
            tj.install_chart()
            tj.build_assets()
            tb.kubectl("apply", "-f", "-", input=kueue_flavors())
            cpus = example()["spec"]["resources"]["cpusPerNode"]
            tb.apply(queues(str(cpus)))
            tb.apply(queued_job(JOB, "grpo-low", multipod_example(STEPS, NO_INTERVAL)))
            tj.watch(lambda j: int(((j.get("status") or {}).get("progress") or {}).get(
                "step") or 0) >= 2, 600, "the tiny job's second step")
            tb.apply(urgent_job())
            # Watching the tiny job (every state it shows is kept) until the urgent one ends.
            tj.watch(lambda _: status(tj, URGENT).get("phase") in TERMINAL, 600,
                     "the urgent job to finish")
            tj.watch(resumed_past(1), 600, "the readmitted tiny job's first new step")
            evicted = evict_worker(tj, 1)
            tj.watch(resumed_past(2), 600, "the drained tiny job's first new step")
            deleted = delete_worker(tj, 2)
            tj.watch(lambda j: j.get("status", {}).get("phase") in TERMINAL, 900,
                     "the preempted, drained and deleted tiny job to finish")
            yield Drained(tj, evicted, deleted)
        finally:
            tb.kubectl("delete", "grpojob", URGENT, "-n", JOB_NS, "--ignore-not-found",
                       "--wait=true", "--timeout=60s", check=False)


def test_the_preempted_job_costs_no_restart_and_resumes_from_its_last_finished_step(
        drained: Drained) -> None:
    run = drained.tj
    st = run.job()["status"]
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    assert status(run, URGENT)["phase"] == "Succeeded"
    first, second, *_ = st["attempts"]
    assert first["outcome"] == "Preempted", first
    assert "Preempted" in first["reason"], first  # Kueue's own eviction words
    assert st["preemptions"] == 1
    # No interval checkpoint before the last step: the step it resumed from is the one the
    # driver saved on SIGTERM, the last it had finished.
    saved = committed_on_stop(run.head_log(0))
    assert saved >= 2 and first["lastCheckpointStep"] == saved, (saved, first)
    assert second["resumedFromStep"] == saved, second
    assert f"resumed from checkpoint step {saved}" in run.head_log(1)


def test_a_drained_or_deleted_worker_pod_costs_no_finished_step(drained: Drained) -> None:
    run = drained.tj
    st = run.job()["status"]
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    _, evicted, deleted, last = st["attempts"]
    # The eviction: the operator sees the pod's DisruptionTarget and ends the attempt at
    # once (deleting its RayCluster), and the driver saves on that SIGTERM.
    assert evicted["outcome"] == "Evicted" and drained.evicted in evicted["reason"], evicted
    saved = committed_on_stop(run.head_log(1))
    assert saved > evicted["resumedFromStep"], (saved, evicted)
    assert deleted["resumedFromStep"] == saved, deleted
    # The plain delete: nothing tells the driver but the pod's preStop hook.
    log = run.head_log(2)
    assert (f"{drained.deleted} is being deleted (its preStop hook asked): saving the last "
            "finished step") in log, log[-3000:]
    saved = committed_on_stop(log)
    assert saved > deleted["resumedFromStep"], (saved, deleted)
    # The driver's exit 143 or the worker's end (after its hook) ends that attempt.
    assert deleted["outcome"] in ("Terminated", "NodeLost"), deleted
    assert last["resumedFromStep"] == saved and last["outcome"] == "Succeeded", last
    assert f"resumed from checkpoint step {saved}" in run.head_log(3)
    assert st["restarts"] == 2 and st["preemptions"] == 1  # a drain is a counted restart


def test_the_job_showed_queued_with_kueues_reason_while_the_urgent_one_ran(
        drained: Drained) -> None:
    run = drained.tj
    # Polled states: attempt 1 waits as long as the urgent job runs. (Between the
    # preemption and attempt 1 the job shows Queued/Preempted only until the old pod is
    # gone, often shorter than a poll: the events keep that.)
    queued = [c for j in run.seen for c in j.get("status", {}).get("conditions") or []
              if c["type"] == "Queued" and c["status"] == "True"]
    waiting = [c["message"] for c in queued if c["reason"] != "Preempted"]
    assert any("ClusterQueue grpo-cpu" in m and "cpu" in m for m in waiting), waiting
    phases = [j.get("status", {}).get("phase") for j in run.seen]
    assert "Queued" in phases and phases[-1] == "Succeeded"
    events = json.loads(run.tb.kubectl("get", "events", "-n", JOB_NS, "--field-selector",
                                       f"involvedObject.name={JOB}", "-o", "json").stdout)
    reasons = {e["reason"] for e in events["items"]}
    assert {"Queued", "Admitted", "Preempted"} <= reasons, reasons
