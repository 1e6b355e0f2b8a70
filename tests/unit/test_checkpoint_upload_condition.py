"""The driver's report of a checkpoint's upload to spec.checkpoint.store becomes the
CheckpointUpload condition, and a Warning event when the store starts failing (pure:
reconcile on the job's status as the trainer's own patches leave it)."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_api.job import GRPOJobStatus
from grpo_operator.reconcile import read_status
from grpo_operator.reconcile.conditions import checkpoint_upload_conditions
from grpo_operator.reconcile.stored import wire
from grpo_testbed.status_patch import apply_status_patch
from grpo_trainer.checkpointing.dcp import upload_wire
from grpo_trainer.liveness.progress import Progress

pytestmark = pytest.mark.unit

T0, T1, T2 = "2026-12-05T00:00:00Z", "2026-12-05T00:01:00Z", "2026-12-05T00:02:00Z"


def reported(status: dict[str, Any], upload: dict[str, object] | None,
             now: str) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The trainer's report merged as the API server merges it, then the operator's answer:
    the status after both, and the CheckpointUpload condition (None: none written)."""
    body = Progress(4, 8, 0.5, 2, updated_at=now, checkpoint_upload=upload).to_status()
    status = apply_status_patch(status, {"progress": body})
    typed = read_status(status).status
    new = checkpoint_upload_conditions(typed.progress, typed.conditions, 1, now)
    if new is None:
        return status, None
    status = apply_status_patch(status, {"conditions": wire(new)})
    GRPOJobStatus.model_validate(status)  # what the CRD schema accepts
    return status, next(c for c in status["conditions"] if c["type"] == "CheckpointUpload")


def test_the_store_failing_turns_it_false_with_the_error_and_its_return_true() -> None:
    status: dict[str, Any] = {}
    status, c = reported(status, upload_wire("Uploading", 4, 3, 0.4, None), T0)
    assert c is None  # files going up without an error: nothing to say
    status, c = reported(status, upload_wire("Retrying", 4, 9, 37.0, "connection refused"), T1)
    assert c is not None and (c["status"], c["reason"]) == ("False", "UploadRetrying")
    assert "checkpoint step 4" in c["message"] and "connection refused" in c["message"]
    assert "37 s" in c["message"] and "uploadDeadlineSeconds" in c["message"]
    status, c = reported(status, upload_wire("Uploaded", 4, 12, 61.0, None), T2)
    assert c is not None and (c["status"], c["reason"]) == ("True", "Uploaded")
    assert c["message"] == "checkpoint step 4 is complete in the store (12 requests, 61 s)"
    assert c["lastTransitionTime"] == T2
    assert "message" not in status["progress"]["checkpointUpload"]  # null removed the error
    # The same report again writes nothing.
    assert reported(status, upload_wire("Uploaded", 4, 12, 61.0, None), T2)[1] is None


def test_a_job_without_a_store_never_gets_the_condition() -> None:
    status, c = reported({}, None, T0)
    assert c is None and "checkpointUpload" not in status["progress"]


def test_the_warning_event_is_sent_once_when_it_turns_retrying() -> None:
    from grpo_operator.reconcile.core import _on_job

    status: dict[str, Any] = {}
    events = []
    for now, upload in ((T0, upload_wire("Retrying", 4, 5, 10.0, "503 Slow Down")),
                        (T1, upload_wire("Retrying", 4, 8, 40.0, "503 Slow Down")),
                        (T2, upload_wire("Uploaded", 4, 9, 44.0, None))):
        body = Progress(4, 8, 0.5, 2, updated_at=now, checkpoint_upload=upload).to_status()
        status = apply_status_patch(status, {"progress": body})
        action = _on_job(read_status(status).status, 1, now)
        events += [e for e in action.events if e[1] == "UploadRetrying"]
        if action.facts.reported is not None:
            status = apply_status_patch(status, {"conditions": wire(action.facts.reported)})
    assert len(events) == 1 and events[0][0] == "Warning" and "503" in events[0][2], events
