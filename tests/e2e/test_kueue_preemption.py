"""Kueue preempts a training GRPOJob for real and it resumes from its checkpoint.

On the real node, with the real Kueue and KubeRay, the trainer image and the operator
running as the chart's ServiceAccount (so the chart's Kueue RBAC is what it has): a
ClusterQueue with CPU for one tiny job; the tiny job (low priority) trains and writes
checkpoints; an urgent job (high priority) arrives, Kueue suspends the tiny job's
RayCluster and KubeRay deletes its pod (the trainer gets SIGTERM mid-run). The operator
records the attempt as Preempted without counting a restart; the urgent job runs to the
end; Kueue readmits the tiny job, whose next attempt resumes from the newest complete
checkpoint and finishes."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grpo_testbed.images import OPERATOR, TRAINER_CPU
from grpo_testbed.launcher import running_testbed
from grpo_testbed.tiny_job import JOB, JOB_NS, TERMINAL, TinyJob, example

pytestmark = pytest.mark.e2e

STEPS = 6
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


def queued_job(name: str, priority: str, steps: int) -> dict[str, Any]:
    doc = example()
    doc["metadata"] = {"name": name, "namespace": JOB_NS}
    spec = doc["spec"]
    spec["queueName"] = QUEUE
    spec["pods"] = {"common": {"priorityClassName": priority}}
    spec["training"]["maxSteps"] = steps
    return doc


def status(tj: TinyJob, name: str) -> dict[str, Any]:
    out = tj.tb.kubectl("get", "grpojob", name, "-n", JOB_NS, "-o", "json")
    return dict(json.loads(out.stdout).get("status") or {})


def kueue_flavors() -> str:
    exe = shutil.which("grpo", path=str(Path(sys.executable).parent))
    assert exe, "the grpo CLI is installed with the operator package"
    return subprocess.run([exe, "kueue-flavors"], capture_output=True, text=True,
                          check=True).stdout


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyJob]:
    work = tmp_path_factory.mktemp("kueue")
    with running_testbed(real_node=True, node_images=(OPERATOR.tag, TRAINER_CPU.tag)) as tb:
        tj = TinyJob(tb, work)
        try:
            tj.install_chart()
            tj.start_operator()
            tj.build_assets()
            tb.kubectl("apply", "-f", "-", input=kueue_flavors())
            cpus = example()["spec"]["resources"]["cpusPerNode"]
            tb.apply(queues(str(cpus)))
            tb.apply(queued_job(JOB, "grpo-low", STEPS))
            tj.watch(lambda j: (j.get("status", {}).get("progress") or {}).get(
                "lastCheckpointStep", 0) >= 2, 600, "the tiny job's first checkpoint")
            tb.apply(queued_job(URGENT, "grpo-high", 2))
            # Watching the tiny job (every state it shows is kept) until the urgent one ends.
            tj.watch(lambda _: status(tj, URGENT).get("phase") in TERMINAL, 600,
                     "the urgent job to finish")
            tj.watch(lambda j: j.get("status", {}).get("phase") in TERMINAL, 900,
                     "the preempted tiny job to finish")
            yield tj
        finally:
            tb.kubectl("delete", "grpojob", URGENT, "-n", JOB_NS, "--ignore-not-found",
                       "--wait=true", "--timeout=60s", check=False)
            tj.teardown()


def test_the_preempted_job_costs_no_restart_and_resumes_from_its_checkpoint(
        run: TinyJob) -> None:
    st = run.job()["status"]
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    assert status(run, URGENT)["phase"] == "Succeeded"
    first, second = st["attempts"]
    assert first["outcome"] == "Preempted", first
    assert "Preempted" in first["reason"], first  # Kueue's own eviction words
    assert st["restarts"] == 0 and st["preemptions"] == 1
    resumed = second["resumedFromStep"]
    assert resumed is not None and resumed >= 2 and resumed == first["lastCheckpointStep"]
    assert f"resumed from checkpoint step {resumed}" in run.head_log(1)
    assert second["outcome"] == "Succeeded"


def test_the_job_showed_queued_with_kueues_reason_while_the_urgent_one_ran(
        run: TinyJob) -> None:
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
