"""Hang and Terminated on the operator's side (pure): the trainer's exit 6 and 143 read
from the head pod, the restart after a Hang (same plan, the collective debug env on the
next attempt only), and the operator's own progress deadline for a driver that stopped
reporting."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import STALL_TIMEOUT_S
from grpo_api.contract import FailureReason as R
from grpo_operator import reconcile as rec
from grpo_operator.config import HANG_GRACE_S, OperatorConfig
from grpo_operator.reconcile import Action, Observed, Planner, read_status
from grpo_operator.reconcile.attempts import finish_attempt
from grpo_operator.reconcile.attempts import start_next_attempt as start
from grpo_operator.reconcile.classify import PodOutcome, classify_pod
from grpo_operator.render import JobRef
from grpo_testbed.status_patch import apply_status_patch

EXAMPLE = Path(__file__).resolve().parents[2] / "examples/grpojob-qwen25vl-7b-h100.yaml"
CONFIG = OperatorConfig(default_image="registry.example/trainer:test")
JOB = JobRef("j", "ns", "u1")
T0 = "2026-11-21T10:00:00Z"
# As the trainer writes them in the image: a full path, and the job's stacks file.
FRAME = ("/home/ray/anaconda3/lib/python3.11/site-packages/grpo_trainer/rollout/"
         "vllm_engine.py:412 generate")
STACKS = ("/checkpoints/ml-research-reinforcement-learning/qwen2vl-72b-grpo-geometry-run-7/stalls/"
          "0-20261121T103000Z.txt")
VERDICT = (f"no progress for 1802 s (timeout 1800 s) in stage rollout: rank 3 is stuck at "
           f"{FRAME}; every rank's stacks: {STACKS}")


def head(code: int, message: dict[str, Any] | None = None) -> dict[str, Any]:
    term = {"exitCode": code, "reason": "Error",
            "message": json.dumps(message) if message is not None else ""}
    return {"metadata": {"name": "j-a0-head", "labels": {
        "grpo.dev/job": "j", "grpo.dev/attempt": "0", "grpo.dev/role": "head"}},
        "status": {"phase": "Failed", "containerStatuses": [
            {"name": "ray-head", "state": {"terminated": term}}]}}


def spec(**restart: Any) -> dict[str, Any]:
    s: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())["spec"]
    s["backoffLimit"] = restart.pop("maxRestarts", 3)
    s["recovery"] = {"backoff": {"initialSeconds": 30, "maxSeconds": 100}, **restart}
    return s


def running_job(sp: dict[str, Any] | None = None) -> dict[str, Any]:
    """A job whose attempt 0 is Running since T0 (the Ready condition's transition)."""
    job = {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
           "metadata": {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1},
           "spec": sp or spec(), "status": {}}
    job, _ = step(job, rec.SpecChanged(), T0)
    pods = [{"metadata": {"name": "j-a0-head", "labels": {
        "grpo.dev/job": "j", "grpo.dev/attempt": "0", "grpo.dev/role": "head"}},
        "status": {"phase": "Running"}}]
    rc = {"metadata": {"name": "j-a0", "labels": {"grpo.dev/job": "j",
                                                   "grpo.dev/attempt": "0"}},
          "status": {"state": "ready"}}
    job, _ = step(job, rec.ClusterChanged(rc), T0, Observed(pods=pods))
    assert job["status"]["phase"] == "Running"
    return job


def step(job: dict[str, Any], event: Any, now: str,
         observed: Observed | None = None) -> tuple[dict[str, Any], Action]:
    action = rec.reconcile(job, observed or Observed(), event, now, CONFIG)
    out = copy.deepcopy(job)
    out["status"] = apply_status_patch(out["status"], action.status)
    return out, action


def at(seconds: float) -> str:
    import datetime as dt

    t = dt.datetime(2026, 11, 21, 10, tzinfo=dt.UTC) + dt.timedelta(seconds=seconds)
    return t.isoformat().replace("+00:00", "Z")


def env_of(action: Action) -> list[dict[str, list[dict[str, Any]]]]:
    rc = next(c for c in action.children if c["kind"] == "RayCluster")
    groups = [rc["spec"]["headGroupSpec"], *rc["spec"]["workerGroupSpecs"]]
    return [{c["name"]: c.get("env") or [] for c in g["template"]["spec"]["containers"]}
            for g in groups]


def ray_env(action: Action) -> list[dict[str, str]]:
    """The Ray container's env of each group, as name -> value."""
    out = []
    for group in env_of(action):
        ray = next(v for k, v in group.items() if k.startswith("ray-"))
        out.append({e["name"]: e.get("value") for e in ray})
    return out


# --- the head pod's exit -----------------------------------------------------------------

def test_exit_6_is_a_hang_naming_the_rank_the_frame_and_the_stacks_file() -> None:
    out = classify_pod(head(6, {"reason": "Hang", "step": 41, "lastCheckpointStep": 40,
                                "detail": VERDICT}))
    assert out is not None and out.reason is R.HANG and out.step == 41
    assert "rank 3 is stuck at" in out.message and FRAME in out.message
    assert STACKS in out.message  # the whole verdict, not cut at 300 characters


def test_exit_6_and_143_without_a_message_keep_their_class() -> None:
    hang, term = classify_pod(head(6)), classify_pod(head(143))
    assert hang is not None and hang.reason is R.HANG
    assert term is not None and term.reason is R.TERMINATED


def test_a_hang_restarts_with_the_same_plan_and_counts_as_a_restart() -> None:
    job = running_job()
    job, action = step(job, rec.PodChanged(head(6, {"reason": "Hang", "step": 41,
                                                    "lastCheckpointStep": 40,
                                                    "detail": VERDICT})), at(60))
    status = job["status"]
    record = status["attempts"][0]
    assert record["outcome"] == "Hang" and "rank 3 is stuck at" in record["reason"]
    assert FRAME in record["reason"] and "remediation" not in record
    assert status["phase"] == "Restarting" and status["restarts"] == 1
    assert "collective debug env" in action.events[0][2]
    plan_before = status["plan"]
    nxt = start(JOB, Planner(job["spec"]), read_status(status).status, at(200))
    assert nxt is not None
    patch = nxt.derive(read_status(status), 1, at(200)).status
    assert patch.get("plan", plan_before) == plan_before


def test_the_attempt_after_a_hang_only_gets_the_collective_debug_env() -> None:
    sp = spec()
    sp.setdefault("pods", {}).setdefault("common", {})["env"] = [
        {"name": "TORCH_NCCL_TRACE_BUFFER_SIZE", "value": "500"}]  # the user's value stays
    job = running_job(sp)
    job, _ = step(job, rec.PodChanged(head(6, {"reason": "Hang", "detail": VERDICT})),
                  at(60))
    nxt = start(JOB, Planner(sp), read_status(job["status"]).status, at(200))
    assert nxt is not None
    for env in ray_env(nxt):
        assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "500"
        assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
        assert env["TORCH_FR_DUMP_TEMP_FILE"] == \
            "/checkpoints/ns/j/attempts/1/stalls/nccl-trace-rank-"  # the attempt after
        assert env["NCCL_DEBUG"] == "INFO"  # over the planner's quieter default
    for group in env_of(nxt):
        for env_list in group.values():
            names = [e["name"] for e in env_list]
            assert len(names) == len(set(names)), names  # never two values for one name
    # An attempt after another failure class starts without it.
    stored = read_status(job["status"])
    status = apply_status_patch(job["status"], nxt.derive(stored, 1, at(200)).status)
    oom = PodOutcome(R.NODE_LOST, 5, "node lost at step 3", 3, None)
    stored = read_status(status)
    ended = finish_attempt(stored.status, oom, at(300), Planner(sp)).derive(stored, 1, at(300))
    after = start(JOB, Planner(sp), read_status(apply_status_patch(status, ended.status)).status,
                  at(1000))
    assert after is not None
    assert all("TORCH_NCCL_DUMP_ON_TIMEOUT" not in env for env in ray_env(after))


def test_a_hang_after_the_last_restart_fails_the_job() -> None:
    job = running_job(spec(maxRestarts=0))
    job, _ = step(job, rec.PodChanged(head(6, {"reason": "Hang", "detail": VERDICT})),
                  at(60))
    assert job["status"]["phase"] == "Failed"
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "Hang" and "after 0 restarts" in failed["message"]


def test_a_terminated_head_outside_a_preemption_is_a_counted_restart() -> None:
    job = running_job()
    job, _ = step(job, rec.PodChanged(head(143, {"reason": "Terminated", "step": 7,
                                                 "lastCheckpointStep": 7,
                                                 "detail": "SIGTERM"})), at(60))
    assert job["status"]["attempts"][0]["outcome"] == "Terminated"
    assert job["status"]["phase"] == "Restarting" and job["status"]["restarts"] == 1
    assert any("resuming from checkpoint step 7" in c["message"]
               for c in job["status"]["conditions"])


# --- the operator's progress deadline ----------------------------------------------------

DEADLINE = STALL_TIMEOUT_S + int(HANG_GRACE_S)


def test_a_silent_driver_is_ended_as_hang_at_the_deadline_and_restarted() -> None:
    job = running_job()
    job, quiet = step(job, rec.ProgressTimer(), at(DEADLINE))
    assert quiet == Action()  # on the deadline, not past it
    job, action = step(job, rec.ProgressTimer(), at(DEADLINE + 1))
    record = job["status"]["attempts"][0]
    assert record["outcome"] == "Hang"
    assert f"reported no progress for {DEADLINE + 1} s" in record["reason"]
    assert job["status"]["phase"] == "Restarting" and job["status"]["restarts"] == 1
    assert action.delete_ray_cluster == "j-a0" and action.restart_reason == "Hang"
    # The next tick (or another operator replica) decides nothing more.
    _, again = step(job, rec.ProgressTimer(), at(DEADLINE + 31))
    assert again == Action()
    # The next attempt gets the collective debug env as after the trainer's own Hang.
    nxt = start(JOB, Planner(job["spec"]), read_status(job["status"]).status, at(DEADLINE + 200))
    assert nxt is not None
    assert all("TORCH_NCCL_TRACE_BUFFER_SIZE" in env for env in ray_env(nxt))


# ("phase", "phaseAt"): what trainer images before the rename write; the CRD keeps them.
@pytest.mark.parametrize("keys", [("stage", "stageAt"), ("phase", "phaseAt")])
def test_step_reports_and_stage_marks_keep_the_attempt_alive(keys: tuple[str, str]) -> None:
    job = running_job()
    job["status"]["progress"] = {"step": 10, "updatedAt": at(600)}  # 60 s a step
    job, action = step(job, rec.ProgressTimer(), at(600 + DEADLINE - 1))
    assert action == Action()
    job["status"]["progress"] |= {keys[0]: "update", keys[1]: at(600 + DEADLINE - 2)}
    job, action = step(job, rec.ProgressTimer(), at(600 + 2 * DEADLINE - 10))
    assert action == Action()
    job, action = step(job, rec.ProgressTimer(), at(600 + 2 * DEADLINE))
    reason = job["status"]["attempts"][0]["reason"]
    assert job["status"]["attempts"][0]["outcome"] == "Hang"
    assert "last report: step 10, stage update" in reason


def test_long_steps_lengthen_the_deadline_as_the_trainers_own_rule_does() -> None:
    job = running_job()
    # 2 steps in 1 h 40 min: 3000 s a step; 5 x that is the stall rule's bound.
    job["status"]["progress"] = {"step": 2, "updatedAt": at(6000)}
    _, action = step(job, rec.ProgressTimer(), at(6000 + 5 * 3000 + int(HANG_GRACE_S)))
    assert action == Action()
    job, action = step(job, rec.ProgressTimer(), at(6000 + 5 * 3000 + int(HANG_GRACE_S) + 1))
    assert job["status"]["attempts"][0]["outcome"] == "Hang"
    assert "a step ~3000 s" in job["status"]["attempts"][0]["reason"]


def test_an_earlier_attempts_report_does_not_count_for_this_one() -> None:
    job = running_job()
    job["status"]["progress"] = {"step": 40, "updatedAt": at(-5000)}  # attempt 0's last
    _, action = step(job, rec.ProgressTimer(), at(DEADLINE))
    assert action == Action()  # counted from Running (T0), not from the older report


def test_no_deadline_with_stall_timeout_0_or_outside_running() -> None:
    job = running_job(spec(stallTimeoutSeconds=0))
    assert step(job, rec.ProgressTimer(), at(10 * DEADLINE))[1] == Action()
    starting = running_job()
    starting["status"]["phase"] = "Starting"
    assert not rec.progress_watched(starting)
    assert step(starting, rec.ProgressTimer(), at(10 * DEADLINE))[1] == Action()
    assert rec.progress_watched(running_job())
