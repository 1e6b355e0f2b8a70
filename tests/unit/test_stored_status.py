"""The stored status is read once into the API's typed model (reconcile/stored.py): an
older or newer operator's status still reads, a rewrite loses none of its fields, and a
field that does not read fails the decision without touching what is stored."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import FailureReason
from grpo_operator import reconcile as rec
from grpo_operator.config import OperatorConfig
from grpo_operator.reconcile.attempts import finish_attempt
from grpo_operator.reconcile.classify import PodOutcome
from grpo_operator.reconcile.planning import Planner
from grpo_operator.reconcile.stored import read_status, wire
from grpo_testbed.status_patch import apply_status_patch

pytestmark = pytest.mark.unit
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
T0, T1 = "2026-12-03T10:00:00.000Z", "2026-12-03T10:05:00.000Z"
CONFIG = OperatorConfig(default_image="registry.example/trainer:test")


def new_job() -> dict[str, Any]:
    spec = yaml.safe_load((EXAMPLES / "grpojob-qwen25vl-7b-a100-40gb.yaml").read_text())["spec"]
    return {"metadata": {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1},
            "spec": spec, "status": {}}


def running_job() -> dict[str, Any]:
    job = new_job()
    for event in (rec.SpecChanged(), rec.ClusterChanged(
            {"metadata": {"name": "j-a0", "labels": {"grpo.dev/attempt": "0"}},
             "status": {"state": "ready"}})):
        action = rec.reconcile(job, rec.Observed(), event, T0, CONFIG)
        job["status"] = apply_status_patch(job["status"], action.status)
    assert job["status"]["phase"] == "Running"
    return job


def test_a_status_the_operator_wrote_reads_back_as_it_is_stored() -> None:
    stored = running_job()["status"]
    read = read_status(stored)
    assert read.unreadable is None and read.status.attempts[0].index == 0
    assert wire(read.status) == stored


def test_an_older_operators_status_reads_missing_null_and_numbers_as_strings() -> None:
    read = read_status({"phase": "Running", "restarts": "2", "attempt": None,
                        "attempts": [{"index": 0, "outcome": "Running"}]})
    assert read.unreadable is None
    assert (read.status.restarts, read.status.attempt, read.status.preemptions) == (2, None, 0)
    assert read_status(None).status.attempts == [] and read_status("x").unreadable is None


def test_fields_this_version_does_not_know_survive_a_rewrite_of_their_object() -> None:
    """A removed field (workerReplacements) and a newer operator's (e.g. after a
    rollback), at the top, in an attempt record and in a condition the trainer's report
    set: the attempt's end rewrites attempts[] and the conditions, and keeps each of them
    where it was. (The phase conditions are the operator's own, rewritten whole.)"""
    job = running_job()
    status = copy.deepcopy(job["status"])
    status["workerReplacements"] = 1
    status["attempts"][0]["nodePool"] = "a"
    status["conditions"].append({"type": "HubFetch", "status": "True", "reason": "Fetched",
                                 "message": "acme/m", "lastTransitionTime": T0,
                                 "hint": "kept"})
    stored = read_status(status)
    assert stored.unreadable is None
    outcome = PodOutcome(FailureReason.CUDA_OOM, 3, "CudaOOM at step 5", 5, 4)
    patch = finish_attempt(stored.status, outcome, T1, Planner(job["spec"])).derive(
        stored, 1, T1).status
    assert patch["attempts"][0]["nodePool"] == "a"
    assert patch["attempts"][0]["outcome"] == "CudaOOM"
    assert patch["conditions"][-1]["hint"] == "kept"
    assert "workerReplacements" not in patch  # not written: the merge keeps it


def test_a_field_that_does_not_read_fails_the_job_and_stays_as_stored() -> None:
    job = running_job()
    job["status"]["attempts"] = [{"index": "first"}]
    stored = read_status(job["status"])
    assert stored.unread("attempts") and not stored.unread("phase")
    action = rec.reconcile(job, rec.Observed(), rec.JobChanged(), T1, CONFIG)
    assert action.status["phase"] == "Failed"
    assert set(action.status) == {"phase", "conditions"}  # attempts[] stays as stored
    failed = next(c for c in action.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InternalError" and "attempts" in failed["message"]
