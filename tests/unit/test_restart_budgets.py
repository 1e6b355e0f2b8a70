"""Restart budgets per failure class (spec.recovery.restartBudgets): a class with a
budget spends only its own restarts, every other class backoffLimit, so lost nodes do not
spend the restarts meant for the job's own errors; the job's message names the budget
that ran out (pure: the attempt records status keeps)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from grpo_api.contract import FailureReason as R
from grpo_api.job import SpecError, parse_spec
from grpo_api.job.recovery import RESTART_CLASSES
from grpo_api.job.status import GRPOJobStatus
from grpo_operator.reconcile import StoredStatus, read_status
from grpo_operator.reconcile.attempts import ensure_attempt, finish_attempt
from grpo_operator.reconcile.attempts import start_next_attempt as start
from grpo_operator.reconcile.classify import PodOutcome
from grpo_operator.reconcile.planning import Planner
from grpo_operator.reconcile.restart_budget import restart_class
from grpo_operator.render import JobRef
from grpo_testbed.examples import example_job
from grpo_testbed.status_patch import apply_status_patch

pytestmark = pytest.mark.unit
JOB = JobRef("j", "ns", "uid-1")
T0 = dt.datetime(2026, 12, 3, 10, tzinfo=dt.UTC)


def spec(backoff_limit: int = 2, **budgets: int) -> dict[str, Any]:
    s = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]
    s["backoffLimit"] = backoff_limit
    s["recovery"] = {"backoff": {"initialSeconds": 0}, "restartBudgets": budgets}
    return s


def at(minutes: int) -> str:
    return (T0 + dt.timedelta(minutes=minutes)).isoformat().replace("+00:00", "Z")


def run(sp: dict[str, Any], failures: list[R]) -> dict[str, Any]:
    """The job's status after its attempts end with `failures`, in order, each restart
    started once its (zero) backoff passed; stops at the first that ends the job."""
    planner = Planner(sp)
    first = ensure_attempt(JOB, planner.plan([], None), GRPOJobStatus(), at(0))
    status = apply_status_patch({}, first.derive(StoredStatus(), 1, at(0)).status)
    for i, reason in enumerate(failures):
        stored = read_status(status)
        ended = finish_attempt(stored.status,
                               PodOutcome(reason, 5, f"{reason.value} at step 3", 3, 2),
                               at(2 * i + 1), planner)
        status = apply_status_patch(status, ended.derive(stored, 1, at(2 * i + 1)).status)
        if status["phase"] == "Failed":
            break
        stored = read_status(status)
        nxt = start(JOB, planner, stored.status, at(2 * i + 2))
        assert nxt is not None
        status = apply_status_patch(status, nxt.derive(stored, 1, at(2 * i + 2)).status)
    return status


def failed_message(status: dict[str, Any]) -> str:
    assert status["phase"] == "Failed", status["phase"]
    return str(next(c for c in status["conditions"] if c["type"] == "Failed")["message"])


def test_without_budgets_every_class_shares_backoff_limit_as_before() -> None:
    st = run(spec(2), [R.NODE_LOST, R.ERROR, R.NODE_LOST])
    assert [a["outcome"] for a in st["attempts"]] == ["NodeLost", "Error", "NodeLost"]
    assert failed_message(st).startswith(
        "node or worker lost at step 3 after 2 restarts; last setting")


def test_lost_nodes_spend_their_own_budget_not_the_one_for_errors() -> None:
    sp = spec(1, nodeLost=4)
    st = run(sp, [R.NODE_LOST, R.WORKERS_MISSING, R.EVICTED, R.ERROR, R.NODE_LOST, R.ERROR])
    # Four node-class restarts and one error restart (backoffLimit 1) were allowed; the
    # second error ends the job, naming backoffLimit's count as before.
    assert [a["outcome"] for a in st["attempts"]] == [
        "NodeLost", "WorkersMissing", "Evicted", "Error", "NodeLost", "Error"]
    assert st["restarts"] == 5
    assert failed_message(st).startswith("Error at step 3 after 5 restarts; last setting")


def test_a_class_budget_that_runs_out_ends_the_job_naming_it() -> None:
    st = run(spec(5, hang=1), [R.HANG, R.ERROR, R.HANG])
    message = failed_message(st)
    assert message.startswith("hang (no progress) at step 3 after 2 restarts (1 of them after "
                              "hang failures: spec.recovery.restartBudgets.hang is 1)"), message
    # A zero budget: the first failure of the class ends the job.
    st = run(spec(5, memory=0), [R.CUDA_OOM])
    assert "spec.recovery.restartBudgets.memory is 0" in failed_message(st)
    assert len(st["attempts"]) == 1


def test_restart_policy_never_restarts_whatever_the_budgets() -> None:
    sp = spec(3, nodeLost=5)
    sp["restartPolicy"] = "Never"
    st = run(sp, [R.NODE_LOST])
    assert len(st["attempts"]) == 1
    assert failed_message(st).startswith("node or worker lost at step 3 after 0 restarts")


def test_every_retried_failure_class_has_one_budget_and_bad_budgets_are_refused() -> None:
    classes = [r for reasons in RESTART_CLASSES.values() for r in reasons]
    assert len(classes) == len(set(classes))
    retried = set(R) - {R.SUCCEEDED, R.PREEMPTED, R.CONFIG_ERROR, R.CHECKPOINT_INCOMPATIBLE}
    assert set(classes) == retried
    assert restart_class("Preempted") is None and restart_class("NodeLost") == "nodeLost"
    bad = spec(3)
    bad["recovery"]["restartBudgets"] = {"nodeLost": -1}
    with pytest.raises(SpecError, match=r"spec\.recovery\.restartBudgets\.nodeLost"):
        parse_spec(bad)
    bad["recovery"]["restartBudgets"] = {"nodeLoss": 3}
    with pytest.raises(SpecError, match="nodeLoss"):
        parse_spec(bad)
