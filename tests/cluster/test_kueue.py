"""Kueue on the testbed: GRPOJobs queue for quota, wait visibly with Kueue's reason,
run when quota frees, and survive preemption (the real Kueue v0.16.2 and KubeRay)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed
from grpo_testbed.operator_process import OperatorProcess
from grpo_testbed.processes import wait_until

ROOT = Path(__file__).resolve().parents[2]
# ClusterQueue grpo-gpus (8 H100) and LocalQueue grpo
QUEUES = ROOT / "examples" / "kueue-queues.yaml"
EIGHT_H100 = "grpojob-qwen25vl-7b-h100.yaml"  # 1 node x 8 H100-80GB
PRIORITIES = {"grpo-low": 100, "grpo-high": 1000}


def grpo_cli(*args: str) -> str:
    exe = shutil.which("grpo", path=str(Path(sys.executable).parent))
    assert exe, "the grpo CLI is installed with the operator package"
    return subprocess.run([exe, *args], capture_output=True, text=True, check=True).stdout


@pytest.fixture(scope="module")
def kueue_queues(testbed: Testbed, operator: OperatorProcess) -> Iterator[None]:
    """What docs/kueue.md tells a platform engineer to apply: the flavors the CLI prints,
    then the example ClusterQueue; and two PriorityClasses for the preemption test."""
    testbed.kubectl("apply", "-f", "-", input=grpo_cli("kueue-flavors"))
    testbed.apply(example_queue("ClusterQueue"))
    testbed.apply([{"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                    "metadata": {"name": name}, "value": value}
                   for name, value in PRIORITIES.items()])
    yield
    testbed.kubectl("delete", "clusterqueue", "grpo-gpus", "--ignore-not-found", check=False)
    testbed.kubectl("delete", "priorityclass", *PRIORITIES, "--ignore-not-found", check=False)


def example_queue(kind: str) -> dict[str, Any]:
    return dict(next(d for d in yaml.safe_load_all(QUEUES.read_text()) if d["kind"] == kind))


@pytest.fixture
def team_ns(kueue_queues: None, op_ns: str, testbed: Testbed) -> str:
    """A namespace the operator watches, with the example's LocalQueue `grpo`."""
    testbed.kubectl("apply", "-n", op_ns, "-f", "-",
                    input=yaml.safe_dump(example_queue("LocalQueue")))
    return op_ns


def submit(tb: Testbed, ns: str, name: str, queue: str = "grpo", priority: str | None = None,
           **spec: Any) -> None:
    overrides: dict[str, Any] = {"queueName": queue, **spec}
    if priority:
        overrides["pods"] = {"common": {"priorityClassName": priority}}
    tb.kubectl("apply", "-n", ns, "-f", "-",
               input=yaml.safe_dump(example_job(EIGHT_H100, name, **overrides)))


def status(tb: Testbed, ns: str, name: str) -> dict[str, Any]:
    job = json.loads(tb.kubectl("get", "grpojob", name, "-n", ns, "-o", "json").stdout)
    return dict(job.get("status") or {})


def wait_for(tb: Testbed, op: OperatorProcess, ns: str, name: str, what: str,
             check: Any, timeout: float = 120) -> dict[str, Any]:
    try:
        wait_until(f"{name}: {what}", lambda: check(status(tb, ns, name)), timeout)
    except TimeoutError as exc:
        workloads = tb.kubectl("get", "workloads", "-n", ns, "-o", "yaml", check=False).stdout
        raise AssertionError(f"{exc}\nstatus: {status(tb, ns, name)}\nworkloads:\n"
                             f"{workloads[-4000:]}\n{op.log_tail()}") from None
    return status(tb, ns, name)


def phase_is(phase: str, attempt: int | None = None) -> Any:
    return lambda s: s.get("phase") == phase and (attempt is None or s.get("attempt") == attempt)


def queued_condition(s: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in s["conditions"] if c["type"] == "Queued")


def test_a_job_over_the_queues_quota_waits_with_kueues_reason_then_runs(
        testbed: Testbed, operator: OperatorProcess, team_ns: str) -> None:
    submit(testbed, team_ns, "first")
    first = wait_for(testbed, operator, team_ns, "first", "Running", phase_is("Running"))
    assert first["rayCluster"]["admittedGeneration"] >= 1
    submit(testbed, team_ns, "second")
    second = wait_for(testbed, operator, team_ns, "second", "Queued for GPU quota",
                      lambda s: s.get("phase") == "Queued"
                      and "nvidia.com/gpu" in queued_condition(s)["message"])
    queued = queued_condition(second)
    assert queued["status"] == "True"
    assert "LocalQueue grpo (ClusterQueue grpo-gpus)" in queued["message"]
    assert "h100-80gb" in queued["message"], queued  # which flavor's quota is short
    # Kueue holds the cluster: KubeRay made no pods for it.
    pods = testbed.kubectl("get", "pods", "-n", team_ns, "-l", "grpo.dev/job=second",
                           "-o", "name").stdout
    assert pods.strip() == ""
    table = testbed.kubectl("get", "grpojobs", "-n", team_ns).stdout
    assert any(line.split()[:2] == ["second", "Queued"] for line in table.splitlines()), table
    events = testbed.kubectl("get", "events", "-n", team_ns, "--field-selector",
                             "involvedObject.name=second").stdout
    assert "Queued" in events
    testbed.kubectl("delete", "grpojob", "first", "-n", team_ns)
    second = wait_for(testbed, operator, team_ns, "second", "Running once quota frees",
                      phase_is("Running", 0))
    assert second["restarts"] == 0 and queued_condition(second)["status"] == "False"


def test_a_higher_priority_job_preempts_and_the_preempted_one_resumes_from_its_checkpoint(
        testbed: Testbed, operator: OperatorProcess, team_ns: str) -> None:
    submit(testbed, team_ns, "low", priority="grpo-low")
    wait_for(testbed, operator, team_ns, "low", "Running", phase_is("Running", 0))
    testbed.kubectl("patch", "grpojob", "low", "-n", team_ns, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"progress": {
                        "step": 6, "totalSteps": 100, "lastCheckpointStep": 5}}}))
    submit(testbed, team_ns, "high", priority="grpo-high")
    low = wait_for(testbed, operator, team_ns, "low", "Preempted",
                   lambda s: (s.get("attempts") or [{}])[0].get("outcome") == "Preempted")
    assert low["restarts"] == 0 and low["preemptions"] == 1
    assert low["attempts"][0]["lastCheckpointStep"] == 5
    assert "Preempted" in low["attempts"][0]["reason"], low["attempts"][0]
    wait_for(testbed, operator, team_ns, "high", "Running", phase_is("Running"))
    low = wait_for(testbed, operator, team_ns, "low", "queued again as attempt 1",
                   phase_is("Queued", 1))
    assert "nvidia.com/gpu" in queued_condition(low)["message"]
    testbed.kubectl("delete", "grpojob", "high", "-n", team_ns)
    low = wait_for(testbed, operator, team_ns, "low", "attempt 1 Running",
                   phase_is("Running", 1))
    assert low["attempts"][1]["resumedFromStep"] == 5 and low["restarts"] == 0
    events = testbed.kubectl("get", "events", "-n", team_ns, "--field-selector",
                             "involvedObject.name=low").stdout
    assert "Preempted" in events and "Admitted" in events


def test_a_missing_local_queue_is_shown_and_infeasible_jobs_never_reach_kueue(
        testbed: Testbed, operator: OperatorProcess, team_ns: str) -> None:
    submit(testbed, team_ns, "lost", queue="nope")
    lost = wait_for(testbed, operator, team_ns, "lost", "Queued: no such LocalQueue",
                    lambda s: s.get("phase") == "Queued"
                    and "doesn't exist" in queued_condition(s)["message"])
    # Kueue's own reason, passed through: v0.16.2 writes Inadmissible for a missing
    # LocalQueue, and a later pass may leave the same message under Pending (a full run on
    # 2026-11-27 saw it). The message is what names the missing queue.
    assert queued_condition(lost)["reason"] in ("Inadmissible", "Pending")
    doc = example_job("grpojob-qwen2vl-72b-h100.yaml", "toobig", queueName="grpo",
                      resources={"gpuType": "A100-40GB", "nodes": 1, "gpusPerNode": 1})
    out = testbed.kubectl("apply", "-n", team_ns, "-f", "-", input=yaml.safe_dump(doc),
                          check=False)
    assert out.returncode != 0 and "memory planner refuses" in out.stderr
    workloads = json.loads(testbed.kubectl("get", "workloads", "-n", team_ns, "-o",
                                           "json").stdout)["items"]
    assert [w["spec"]["queueName"] for w in workloads] == ["nope"]  # none for toobig
    moved = testbed.kubectl("patch", "grpojob", "lost", "-n", team_ns, "--type=merge",
                            "-p", '{"spec":{"queueName":"grpo"}}', check=False)
    assert moved.returncode != 0 and "spec.queueName cannot change" in moved.stderr


def test_the_kueue_label_is_the_jobs_queue_and_a_second_queue_name_is_refused(
        testbed: Testbed, operator: OperatorProcess, team_ns: str) -> None:
    """As on Kueue's own jobs: a GRPOJob labelled kueue.x-k8s.io/queue-name and without
    spec.queueName is queued there (the mutating webhook records the queue), and a label
    and a queueName that disagree are refused naming both."""
    doc = example_job(EIGHT_H100, "labelled")
    doc["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "elsewhere"}
    testbed.kubectl("apply", "-n", team_ns, "-f", "-", input=yaml.safe_dump(doc))
    job = json.loads(testbed.kubectl("get", "grpojob", "labelled", "-n", team_ns, "-o",
                                     "json").stdout)
    assert job["spec"]["queueName"] == "elsewhere"
    wait_for(testbed, operator, team_ns, "labelled", "Queued: no such LocalQueue",
             lambda s: s.get("phase") == "Queued"
             and "doesn't exist" in queued_condition(s)["message"])
    both = example_job(EIGHT_H100, "torn", queueName="grpo")
    both["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": "elsewhere"}
    out = testbed.kubectl("apply", "-n", team_ns, "-f", "-", input=yaml.safe_dump(both),
                          check=False)
    assert out.returncode != 0
    assert "'elsewhere' and spec.queueName 'grpo' name different queues" in out.stderr
