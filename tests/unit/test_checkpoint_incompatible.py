"""CheckpointIncompatible across the contract: the trainer's exit 7 and termination
message, the operator's class, and its decision (Failed, not retried, checkpoint kept).

The trainer tier (tests/trainer/test_checkpoint_incompatible.py) raises it for real from a
rank's load; here the exception crosses Ray's wrapper as Ray builds it, and the message
the driver writes is read back by the operator's classifier."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from ray import exceptions as rex

from grpo_api.contract import ExitCode, FailureReason, Reason
from grpo_api.job.status import GRPOJobStatus
from grpo_operator.planner.ladder import remediation_ladder
from grpo_operator.reconcile import StoredStatus, read_status
from grpo_operator.reconcile.attempts import ensure_attempt, finish_attempt
from grpo_operator.reconcile.classify import classify_pod
from grpo_operator.reconcile.planning import Planner
from grpo_operator.render import JobRef
from grpo_testbed.status_patch import apply_status_patch
from grpo_trainer.checkpointing.compat import incompatible_message
from grpo_trainer.errors import CheckpointIncompatible, StepError, classify
from grpo_trainer.liveness.termination import termination_message

pytestmark = pytest.mark.unit
EXAMPLE = Path(__file__).resolve().parents[2] / "examples/grpojob-qwen25vl-7b-a100-40gb.yaml"
NOW = "2026-11-21T10:00:00Z"
KEYS = tuple(f"model.model.language_model.layers.{i}.self_attn.q_proj.lora_A.weight: the "
             "checkpoint has float32[8, 3584], this run float32[16, 3584]" for i in range(28))
DETAIL = incompatible_message(40, "/checkpoints/ml/qwen-grpo/step-40", KEYS,
                              "actor.precision mixed, LoRA")


def _head(message: str) -> dict[str, Any]:
    term = {"exitCode": int(ExitCode.CHECKPOINT_INCOMPATIBLE), "reason": "Error",
            "message": message}
    return {"metadata": {"name": "j-a0-head"}, "spec": {"nodeName": "gpu-0"},
            "status": {"phase": "Failed", "containerStatuses": [
                {"name": "ray-head", "state": {"terminated": term}}]}}


def test_raised_on_a_rank_it_is_exit_7_with_the_whole_message_as_detail() -> None:
    # What the driver catches: Ray's RayTaskError, made an instance of the cause's class
    # too, whose text is the actor's repr and the traceback before the message.
    wrapped = rex.RayTaskError("Worker.load_checkpoint", "Traceback ...",
                               CheckpointIncompatible(DETAIL)).as_instanceof_cause()
    assert isinstance(wrapped, CheckpointIncompatible) and str(wrapped) != DETAIL
    c = classify(wrapped)
    assert (c.code, c.reason) == (ExitCode.CHECKPOINT_INCOMPATIBLE,
                                  FailureReason.CHECKPOINT_INCOMPATIBLE)
    assert c.detail == DETAIL  # no type prefix: the message is the user's instructions
    assert classify(StepError(3, CheckpointIncompatible("x"))).code == 7


def test_the_termination_message_reaches_the_operator_with_step_and_advice() -> None:
    msg = termination_message(FailureReason.CHECKPOINT_INCOMPATIBLE, None, 40, DETAIL)
    out = classify_pod(_head(msg))
    assert out is not None and out.reason is FailureReason.CHECKPOINT_INCOMPATIBLE
    assert out.exit_code == 7 and out.last_checkpoint_step == 40
    # Kept past the 300 characters of other details: the step, a key, and what to do.
    assert "checkpoint step 40" in out.message and "lora_A" in out.message
    assert "Resume it with the settings it was saved with" in out.message
    # An exit 7 whose message was lost keeps its class.
    bare = classify_pod(_head(""))
    assert bare is not None and bare.reason is FailureReason.CHECKPOINT_INCOMPATIBLE


def test_it_has_no_memory_ladder_and_is_a_reason_the_operator_writes() -> None:
    assert remediation_ladder(FailureReason.CHECKPOINT_INCOMPATIBLE) == ()
    assert Reason(FailureReason.CHECKPOINT_INCOMPATIBLE.value) is Reason.CHECKPOINT_INCOMPATIBLE


def test_the_job_fails_without_a_retry_and_keeps_its_checkpoint_step() -> None:
    sp: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())["spec"]
    sp["backoffLimit"] = 3
    sp["recovery"] = {"allowPrecisionChange": True}
    job = JobRef("j", "ns", "uid-1")
    first = ensure_attempt(job, Planner(sp).plan([], None), GRPOJobStatus(), NOW)
    st = apply_status_patch({}, first.derive(StoredStatus(), 1, NOW).status)
    out = classify_pod(_head(termination_message(
        FailureReason.CHECKPOINT_INCOMPATIBLE, None, 40, DETAIL)))
    assert out is not None
    action = finish_attempt(read_status(st).status, out, NOW, Planner(sp))
    d = action.derive(read_status(st), 1, NOW)
    status = apply_status_patch(st, d.status)
    assert status["phase"] == "Failed" and not status.get("nextAttempt")
    assert status["restarts"] == 0 and len(status["attempts"]) == 1
    record = status["attempts"][0]
    assert record["outcome"] == "CheckpointIncompatible" and record["lastCheckpointStep"] == 40
    assert "remediation" not in record
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "CheckpointIncompatible" and "not retried" in failed["message"]
    assert "checkpoint step 40" in failed["message"]
    assert [(kind, reason) for kind, reason, _ in action.events] == [
        ("Warning", Reason.CHECKPOINT_INCOMPATIBLE)]
    assert json.dumps(status)  # what the API server stores
