"""Recovery: classify how an attempt ended, remediate, restart from the checkpoint."""

from __future__ import annotations

import datetime as dt
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_testbed.chaos import end_pod, live_pod
from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed
from grpo_testbed.operator_process import OperatorProcess
from grpo_testbed.processes import wait_until

FAST = {"maxRestarts": 3, "backoff": {"initialSeconds": 2, "maxSeconds": 4}}


def manifest(example: str, name: str, restart_policy: dict[str, Any]) -> str:
    """The example with `restart_policy` (maxRestarts and the recovery settings) as
    backoffLimit and spec.recovery."""
    recovery = dict(restart_policy)
    limit = recovery.pop("maxRestarts")
    return yaml.safe_dump(example_job(example, name, backoffLimit=limit, recovery=recovery))


def job(tb: Testbed, ns: str, name: str) -> dict[str, Any]:
    return json.loads(tb.kubectl("get", "grpojob", name, "-n", ns, "-o", "json").stdout)


def status(tb: Testbed, ns: str, name: str) -> dict[str, Any]:
    return dict(job(tb, ns, name).get("status") or {})


def wait_status(tb: Testbed, op: OperatorProcess, ns: str, name: str, what: str,
                check: Any, timeout: float = 120) -> dict[str, Any]:
    try:
        wait_until(what, lambda: check(status(tb, ns, name)), timeout)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {status(tb, ns, name)}\n{op.log_tail()}") from None
    return status(tb, ns, name)


def running(attempt: int) -> Any:
    return lambda s: s.get("phase") == "Running" and s.get("attempt") == attempt


def planned_settings(tb: Testbed, ns: str, job: str, attempt: int) -> dict[str, Any]:
    """What the trainer of an attempt is told: its config's actor and rollout sections
    (the one channel for planned settings) and the head's allocator env."""
    cm = json.loads(tb.kubectl("get", "configmap", f"{job}-config-{attempt}", "-n", ns,
                               "-o", "json").stdout)
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    obj = json.loads(tb.kubectl("get", "raycluster", f"{job}-a{attempt}", "-n", ns, "-o",
                                "json").stdout)
    env = {e["name"]: e.get("value", "") for e in
           obj["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    return {**{f"actor.{k}": v for k, v in cfg["actor"].items()},
            **{f"rollout.{k}": v for k, v in cfg["rollout"].items()},
            "PYTORCH_CUDA_ALLOC_CONF": env.get("PYTORCH_CUDA_ALLOC_CONF")}


def claim_of(tb: Testbed, ns: str, rc: str) -> str:
    obj = json.loads(tb.kubectl("get", "raycluster", rc, "-n", ns, "-o", "json").stdout)
    vols = obj["spec"]["headGroupSpec"]["template"]["spec"]["volumes"]
    return str(next(v for v in vols if v["name"] == "checkpoints")[
        "persistentVolumeClaim"]["claimName"])


def kill_head(tb: Testbed, ns: str, name: str, exit_code: int = 137, reason: str = "OOMKilled",
              message: str = "") -> None:
    end_pod(tb.kubectl, ns, live_pod(tb.kubectl, ns, name, "head"), exit_code, reason, message)


def report_progress(tb: Testbed, ns: str, name: str, step: int, ckpt: int) -> None:
    tb.kubectl("patch", "grpojob", name, "-n", ns, "--subresource=status", "--type=merge",
               "-p", json.dumps({"status": {"progress": {"step": step, "totalSteps": 100,
                                                         "lastCheckpointStep": ckpt}}}))


def test_cuda_oom_restarts_with_the_next_safer_setting_from_the_checkpoint(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    """The CudaOOM ladder up to its bf16 rung, to Succeeded: with allowPrecisionChange a
    second OOM in training moves the job to bf16 (docs/memory-model.md), whose attempt
    resumes the mixed checkpoint (the trainer's side: tests/trainer/test_rung_resume.py)."""
    policy = {**FAST, "allowPrecisionChange": True}
    testbed.kubectl("apply", "-n", op_ns, "-f", "-",
                    input=manifest("grpojob-qwen25vl-7b-a100-40gb.yaml", "oom", policy))
    wait_status(testbed, operator, op_ns, "oom", "attempt 0 Running", running(0))
    plan0 = planned_settings(testbed, op_ns, "oom", 0)
    claim0 = claim_of(testbed, op_ns, "oom-a0")
    msg = json.dumps({"reason": "CudaOOM", "step": 12, "lastCheckpointStep": 10,
                      "detail": "CUDA out of memory. Tried to allocate 2.00 GiB"})
    t_fail = time.monotonic()
    kill_head(testbed, op_ns, "oom", 3, "Error", msg)
    s = wait_status(testbed, operator, op_ns, "oom", "Restarting",
                    lambda s: s.get("phase") == "Restarting", 60)
    assert s["attempts"][0]["outcome"] == "CudaOOM"
    assert s["attempts"][0]["lastCheckpointStep"] == 10
    remediation = s["attempts"][0]["remediation"]
    assert remediation.startswith("CudaOOM")
    s = wait_status(testbed, operator, op_ns, "oom", "attempt 1 Running", running(1))
    assert time.monotonic() - t_fail >= 2  # the backoff was honoured
    assert s["restarts"] == 1 and s["attempts"][1]["resumedFromStep"] == 10
    plan1 = planned_settings(testbed, op_ns, "oom", 1)
    changed = {k for k in plan0.keys() | plan1.keys() if plan0.get(k) != plan1.get(k)}
    assert changed, "the remediated attempt must run with different memory settings"
    assert claim_of(testbed, op_ns, "oom-a1") == claim0  # same checkpoints
    # The failed attempt's cluster was released while waiting out the backoff.
    assert testbed.kubectl("get", "raycluster", "oom-a0", "-n", op_ns,
                           check=False).returncode != 0
    events = testbed.kubectl("get", "events", "-n", op_ns).stdout
    assert "Restarted" in events and "CudaOOM" in events

    # Out of memory again in training: the micro-batch is halved already, so the next
    # rung that relieves training is bf16 (before offloading, which slows every step).
    again = json.dumps({"reason": "CudaOOM", "step": 16, "lastCheckpointStep": 15,
                        "stage": "training", "detail": "CUDA out of memory."})
    kill_head(testbed, op_ns, "oom", 3, "Error", again)
    s = wait_status(testbed, operator, op_ns, "oom", "attempt 2 Running", running(2))
    assert s["attempts"][1]["remediation"].startswith("CudaOOM: bf16 training: ")
    assert s["attempts"][1]["failedStage"] == "training"
    assert s["attempts"][2]["resumedFromStep"] == 15 and s["plan"]["precision"] == "bf16"
    plan2 = planned_settings(testbed, op_ns, "oom", 2)
    assert (plan1["actor.precision"], plan2["actor.precision"]) == ("mixed", "bf16")
    assert claim_of(testbed, op_ns, "oom-a2") == claim0
    done = json.dumps({"reason": "Succeeded", "step": 20, "lastCheckpointStep": 20,
                       "detail": ""})
    kill_head(testbed, op_ns, "oom", 0, "Completed", done)
    s = wait_status(testbed, operator, op_ns, "oom", "Succeeded",
                    lambda s: s.get("phase") == "Succeeded", 60)
    assert [a["outcome"] for a in s["attempts"]] == ["CudaOOM", "CudaOOM", "Succeeded"]
    assert [a.get("remediation", "").split(":")[1].strip() for a in s["attempts"][:2]] == [
        remediation.split(":")[1].strip(), "bf16 training"]
    assert s["restarts"] == 2


def test_host_oom_kill_of_the_head_is_classified_and_retried(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    testbed.kubectl("apply", "-n", op_ns, "-f", "-",
                    input=manifest("grpojob-tiny.yaml", "host", FAST))
    wait_status(testbed, operator, op_ns, "host", "attempt 0 Running", running(0))
    report_progress(testbed, op_ns, "host", 5, 4)
    kill_head(testbed, op_ns, "host")  # kwok chaos: OOMKilled, exit 137
    s = wait_status(testbed, operator, op_ns, "host", "attempt 1 Running", running(1))
    assert s["attempts"][0]["outcome"] == "HostOOM"
    assert s["attempts"][1]["resumedFromStep"] == 4


@pytest.mark.parametrize(("code", "reason", "detail"), [
    (2, "ConfigError", "data.train_files: missing"),
    # A checkpoint no setting of the plan can load: the same plan would fail the same way.
    (7, "CheckpointIncompatible", "checkpoint step 4 (/checkpoints/ns/cfg/step-4) cannot be "
     "loaded with this run's settings (actor.precision mixed, LoRA): ..."),
], ids=["ConfigError", "CheckpointIncompatible"])
def test_config_error_is_not_retried(
        testbed: Testbed, operator: OperatorProcess, op_ns: str, code: int, reason: str,
        detail: str) -> None:
    name = f"cfg{code}"
    testbed.kubectl("apply", "-n", op_ns, "-f", "-",
                    input=manifest("grpojob-tiny.yaml", name, FAST))
    wait_status(testbed, operator, op_ns, name, "attempt 0 Running", running(0))
    kill_head(testbed, op_ns, name, code, "Error",
              json.dumps({"reason": reason, "lastCheckpointStep": 4, "detail": detail}))
    s = wait_status(testbed, operator, op_ns, name, "Failed",
                    lambda s: s.get("phase") == "Failed", 60)
    time.sleep(3)
    s = status(testbed, op_ns, name)
    assert s["restarts"] == 0 and len(s["attempts"]) == 1
    # As the API server stored it: the outcome is in the CRD's enum, the detail kept.
    assert s["attempts"][0]["outcome"] == reason and detail in s["attempts"][0]["reason"]
    failed = next(c for c in s["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == reason and "not retried" in failed["message"]


def test_max_restarts_ends_in_failed_after_exactly_that_many(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    policy = {"maxRestarts": 2, "backoff": {"initialSeconds": 1, "maxSeconds": 2}}
    testbed.kubectl("apply", "-n", op_ns, "-f", "-",
                    input=manifest("grpojob-tiny.yaml", "flaky", policy))
    for attempt in range(3):
        wait_status(testbed, operator, op_ns, "flaky", f"attempt {attempt} Running",
                    running(attempt))
        kill_head(testbed, op_ns, "flaky", 1, "Error", json.dumps({"reason": "Error",
                                                                    "step": attempt}))
    s = wait_status(testbed, operator, op_ns, "flaky", "Failed",
                    lambda s: s.get("phase") == "Failed", 60)
    assert s["restarts"] == 2 and len(s["attempts"]) == 3
    failed = next(c for c in s["conditions"] if c["type"] == "Failed")
    assert "after 2 restarts" in failed["message"]


def test_delete_during_backoff_leaves_nothing_behind_but_its_checkpoints(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    """Deleted while waiting out its backoff, the job must stay gone: watched until well
    past the moment its next attempt was due, nothing of it may come back. Its
    checkpoint claim stays (checkpoint.retention Retain), the one it had."""
    slow = {"maxRestarts": 3, "backoff": {"initialSeconds": 10, "maxSeconds": 10}}
    testbed.kubectl("apply", "-n", op_ns, "-f", "-",
                    input=manifest("grpojob-tiny.yaml", "bye", slow))
    wait_status(testbed, operator, op_ns, "bye", "attempt 0 Running", running(0))
    kill_head(testbed, op_ns, "bye")
    s = wait_status(testbed, operator, op_ns, "bye", "Restarting",
                    lambda s: s.get("phase") == "Restarting", 60)
    due = dt.datetime.fromisoformat(s["nextAttempt"]["notBefore"].replace("Z", "+00:00"))

    def left(kinds: tuple[str, ...]) -> list[dict[str, Any]]:
        return [i for k in kinds for i in json.loads(testbed.kubectl(
            "get", k, "-n", op_ns, "-l", "grpo.dev/job=bye", "-o", "json").stdout)["items"]]

    # What exists before the delete, by uid: creation timestamps have whole seconds, and
    # the claim made at the job's start can share the delete's second.
    ours = ("raycluster", "configmap", "persistentvolumeclaim", "serviceaccount")
    before = {i["metadata"]["uid"] for i in left(ours)}
    testbed.kubectl("delete", "grpojob", "bye", "-n", op_ns, "--wait=true")
    assert dt.datetime.now(dt.UTC) < due, "deleted too late to test the backoff"
    while dt.datetime.now(dt.UTC) < due + dt.timedelta(seconds=8):
        new = [f"{i['kind']}/{i['metadata']['name']}" for i in left(ours)
               if i["metadata"]["uid"] not in before]
        assert not new, f"created after the delete: {new}\n{operator.log_tail()}"
        time.sleep(0.5)
    wait_until("nothing of the job left", lambda: not left(
        ("raycluster", "configmap", "serviceaccount", "pods")), 60)
    assert [c["metadata"]["name"] for c in left(("persistentvolumeclaim",))] == [
        "bye-checkpoints"]


def test_operator_restart_during_backoff_neither_loses_nor_duplicates_the_attempt(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    policy = {"maxRestarts": 3, "backoff": {"initialSeconds": 6, "maxSeconds": 6}}
    testbed.kubectl("apply", "-n", op_ns, "-f", "-",
                    input=manifest("grpojob-tiny.yaml", "survive", policy))
    wait_status(testbed, operator, op_ns, "survive", "attempt 0 Running", running(0))
    kill_head(testbed, op_ns, "survive")
    wait_status(testbed, operator, op_ns, "survive", "Restarting",
                lambda s: s.get("phase") == "Restarting", 60)
    operator.kill()
    operator.start()
    s = wait_status(testbed, operator, op_ns, "survive", "attempt 1 Running", running(1))
    assert [a["index"] for a in s["attempts"]] == [0, 1]
    rcs = json.loads(testbed.kubectl("get", "raycluster", "-n", op_ns, "-o", "json").stdout)
    assert [r["metadata"]["name"] for r in rcs["items"]] == ["survive-a1"]


def test_an_oom_killed_worker_pod_is_host_oom_and_the_next_attempt_is_remediated(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    """A GPU job's ranks live on its worker pods: the kernel killing one at its memory
    limit ends the attempt as HostOOM and the next attempt runs with the host-memory
    ladder's next setting (not the same settings again until maxRestarts)."""
    testbed.kubectl("apply", "-n", op_ns, "-f", "-",
                    input=manifest("grpojob-qwen25vl-7b-a100-40gb.yaml", "wk", FAST))
    wait_status(testbed, operator, op_ns, "wk", "attempt 0 Running", running(0))
    plan0 = status(testbed, op_ns, "wk")["plan"]
    report_progress(testbed, op_ns, "wk", 9, 8)
    workers = json.loads(testbed.kubectl("get", "pods", "-n", op_ns, "-l",
                                         "grpo.dev/job=wk,grpo.dev/role=worker", "-o", "json"
                                         ).stdout)["items"]
    victim = workers[0]["metadata"]["name"]
    testbed.kubectl("label", "pod", victim, "-n", op_ns, "grpo.dev/chaos=terminate")  # 137
    s = wait_status(testbed, operator, op_ns, "wk", "attempt 1 Running", running(1), 120)
    first = s["attempts"][0]
    assert first["outcome"] == "HostOOM" and victim in first["reason"]
    assert first["remediation"].startswith("HostOOM: ")
    assert s["restarts"] == 1 and s["attempts"][1]["resumedFromStep"] == 8
    plan1 = s["plan"]
    changed = {k for k in plan0 if k != "details" and plan0[k] != plan1.get(k)}
    assert changed, f"attempt 1 runs the same plan: {plan1}"
    assert "HostOOM" in testbed.kubectl("get", "events", "-n", op_ns).stdout


def test_a_lost_nodes_successor_attempt_avoids_that_node(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    """A worker pod gone with its node ends the attempt as NodeLost; the attempt records
    the node and its successor's pods prefer the others, which the real scheduler honours
    (the testbed's two kwok A100 nodes: attempt 1 lands on the other one)."""
    testbed.kubectl("apply", "-n", op_ns, "-f", "-",
                    input=manifest("grpojob-qwen25vl-7b-a100-40gb.yaml", "nl", FAST))
    wait_status(testbed, operator, op_ns, "nl", "attempt 0 Running", running(0))

    def worker(attempt: int) -> dict[str, Any]:
        (pod,) = json.loads(testbed.kubectl(
            "get", "pods", "-n", op_ns, "-o", "json", "-l",
            f"grpo.dev/job=nl,grpo.dev/role=worker,grpo.dev/attempt={attempt}").stdout)["items"]
        return dict(pod)

    first = worker(0)
    lost = first["spec"]["nodeName"]
    testbed.kubectl("delete", "pod", first["metadata"]["name"], "-n", op_ns,
                    "--grace-period=0", "--force")
    s = wait_status(testbed, operator, op_ns, "nl", "attempt 1 Running", running(1), 120)
    assert s["attempts"][0]["outcome"] == "NodeLost" and s["attempts"][0]["node"] == lost
    second = worker(1)
    assert second["spec"]["nodeName"] != lost
    terms = second["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"]
    assert terms == [{"weight": 100, "preference": {"matchFields": [
        {"key": "metadata.name", "operator": "NotIn", "values": [lost]}]}}]


# --- Hang: the trainer's exit 6, and the operator's own progress deadline ----------------

HANG_GRACE_S = 2  # the operator's --hang-grace here: a silent job ends in seconds


@pytest.fixture
def hang_operator(grpo_crd: Testbed, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    """An operator for the test's namespace only, with a short grace past the deadline.
    Its jobs are deleted before it stops: a Running job carries Kopf's finalizer while
    the progress timer runs, which only a running operator removes."""
    op = OperatorProcess(grpo_crd, tmp_path, webhook=False, namespaces=(ns,),
                         extra_args=("--hang-grace", str(HANG_GRACE_S))).start()
    yield op
    grpo_crd.kubectl("delete", "grpojobs", "--all", "-n", ns, "--wait=true", "--timeout=60s",
                     check=False)
    op.stop()


def head_env(tb: Testbed, ns: str, rc: str) -> dict[str, str]:
    obj = json.loads(tb.kubectl("get", "raycluster", rc, "-n", ns, "-o", "json").stdout)
    containers = obj["spec"]["headGroupSpec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in containers[0].get("env") or []}


def test_a_job_whose_progress_stops_is_ended_as_hang_and_restarted(
        testbed: Testbed, hang_operator: OperatorProcess, ns: str) -> None:
    """Nothing reports for the job (its driver stuck itself): past stallTimeoutSeconds +
    the grace the operator ends the attempt as Hang, and the next one resumes from the
    checkpoint with the collective debug env."""
    policy = {**FAST, "stallTimeoutSeconds": 3}
    testbed.kubectl("apply", "-n", ns, "-f", "-",
                    input=manifest("grpojob-tiny.yaml", "silent", policy))
    wait_status(testbed, hang_operator, ns, "silent", "attempt 0 Running", running(0))
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in head_env(testbed, ns, "silent-a0")
    report_progress(testbed, ns, "silent", 2, 2)  # no updatedAt or stageAt: old reports
    t0 = time.monotonic()
    s = wait_status(testbed, hang_operator, ns, "silent", "attempt 1 Running", running(1), 120)
    first = s["attempts"][0]
    assert first["outcome"] == "Hang", first
    assert "the driver reported no progress for" in first["reason"]
    assert "stallTimeoutSeconds 3" in first["reason"]
    assert s["restarts"] == 1 and s["attempts"][1]["resumedFromStep"] == 2
    assert time.monotonic() - t0 < 90  # the timer looks every 30 s
    env = head_env(testbed, ns, "silent-a1")
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"].endswith("/attempts/1/stalls/nccl-trace-rank-")


def test_a_head_that_exits_6_is_a_hang_with_the_rank_and_frame_in_status(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    name = "stuck-qwen2vl-72b-geometry-grpo-run-2026-11-21"  # a long stacks path
    testbed.kubectl("apply", "-n", op_ns, "-f", "-",
                    input=manifest("grpojob-tiny.yaml", name, FAST))
    wait_status(testbed, operator, op_ns, name, "attempt 0 Running", running(0))
    frame = ("/home/ray/anaconda3/lib/python3.11/site-packages/grpo_trainer/checkpointing/"
             "sharded_state.py:212 save_rank_shard")
    stacks = f"/checkpoints/{op_ns}/{name}/stalls/0-20261121T103000Z.txt"
    verdict = (f"no progress for 1802 s (timeout 1800 s) in stage checkpoint: rank 3 is "
               f"stuck at {frame}; every rank's stacks: {stacks}")
    assert len(verdict) > 300  # more than other failures' one line keeps
    kill_head(testbed, op_ns, name, 6, "Error", json.dumps(
        {"reason": "Hang", "step": 5, "lastCheckpointStep": 4, "detail": verdict}))
    s = wait_status(testbed, operator, op_ns, name, "attempt 1 Running", running(1))
    first = s["attempts"][0]
    assert first["outcome"] == "Hang" and "remediation" not in first
    assert "rank 3 is stuck at" in first["reason"] and frame in first["reason"]
    assert stacks in first["reason"]
    assert s["restarts"] == 1 and s["attempts"][1]["resumedFromStep"] == 4
    assert head_env(testbed, op_ns, f"{name}-a1")["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "20000"
