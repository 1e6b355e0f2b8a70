"""The status is derived in one place (reconcile/status.py, as KubeRay's
calculateStatus): one row per phase and reason a user sees, each patch merged and checked
against the CRD's schema as the API server would."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from grpo_api.contract import PHASE_CONDITIONS, KueueReason, Phase, Reason
from grpo_operator.reconcile.conditions import PhaseView
from grpo_operator.reconcile.status import StatusFacts, derive_status
from grpo_testbed.wire import apply_status_patch

pytestmark = pytest.mark.unit
RECONCILE = Path(__file__).resolve().parents[2] / "operator/grpo_operator/reconcile"
T0, T1 = "2026-11-26T10:00:00.000Z", "2026-11-26T10:05:00.000Z"

# (phase, reason, degraded, the phase conditions that are True)
ROWS: list[tuple[Phase, Reason | KueueReason, bool, set[str]]] = [
    (Phase.PENDING, Reason.CREATING_CLUSTER, False, {"Progressing"}),
    (Phase.PENDING, Reason.WAITING_FOR_PODS, False, {"Progressing"}),
    (Phase.PENDING, Reason.UNSCHEDULABLE, False, {"Progressing"}),
    (Phase.PENDING, Reason.CLAIM_MISSING, False, {"Progressing"}),
    (Phase.PENDING, Reason.WAITING_FOR_PREVIOUS_JOB, False, {"Progressing"}),
    (Phase.PENDING, Reason.READING_MODEL_CONFIG, False, {"Progressing"}),
    (Phase.PENDING, Reason.MODEL_CONFIG_UNAVAILABLE, True, {"Progressing", "Degraded"}),
    (Phase.PENDING, Reason.CREATE_FAILED, True, {"Progressing", "Degraded"}),
    (Phase.PENDING, Reason.POD_CREATE_REFUSED, True, {"Progressing", "Degraded"}),
    (Phase.QUEUED, Reason.WAITING_FOR_WORKLOAD, False, {"Queued"}),
    (Phase.QUEUED, KueueReason("Pending"), False, {"Queued"}),
    (Phase.QUEUED, Reason.PREEMPTED, False, {"Queued"}),
    (Phase.STARTING, Reason.PODS_STARTING, False, {"Progressing"}),
    (Phase.RUNNING, Reason.CLUSTER_RUNNING, False, {"Ready", "Progressing"}),
    (Phase.RESTARTING, Reason.CUDA_OOM, False, {"Progressing", "Degraded"}),
    (Phase.RESTARTING, Reason.WAITING_FOR_PREVIOUS_ATTEMPT, False, {"Progressing", "Degraded"}),
    (Phase.SUSPENDED, Reason.SUSPENDED_BY_USER, False, {"Suspended"}),
    (Phase.SUCCEEDED, Reason.TRAINING_FINISHED, False, {"Succeeded"}),
    (Phase.RESTARTING, Reason.HANG, False, {"Progressing", "Degraded"}),
    (Phase.FAILED, Reason.INVALID_NAME, False, {"Failed"}),
    (Phase.FAILED, Reason.INVALID_SPEC, False, {"Failed"}),
    (Phase.FAILED, Reason.CONFIG_ERROR, False, {"Failed"}),
    (Phase.FAILED, Reason.PREEMPTED, False, {"Failed"}),
    (Phase.FAILED, Reason.INFEASIBLE, False, {"Failed"}),
    (Phase.FAILED, Reason.POD_CREATE_REFUSED, False, {"Failed"}),
    (Phase.FAILED, Reason.HOST_OOM, False, {"Failed"}),
    (Phase.FAILED, Reason.INTERNAL_ERROR, False, {"Failed"}),
]


@pytest.mark.parametrize(("phase", "reason", "degraded", "true"), ROWS,
                         ids=[f"{r[0]}-{r[1]}" for r in ROWS])
def test_each_phase_and_reason_derives_its_conditions(
        phase: Phase, reason: Reason | KueueReason, degraded: bool, true: set[str]) -> None:
    facts = StatusFacts(PhaseView(phase, reason, f"why {reason}"), degraded=degraded)
    patch = derive_status({}, facts, 3, T0)
    status = apply_status_patch({}, patch)  # the API server accepts it
    assert status["phase"] == phase and status["observedGeneration"] == 3
    conditions = {c["type"]: c for c in status["conditions"]}
    assert set(conditions) == {str(t) for t in PHASE_CONDITIONS}
    assert {t for t, c in conditions.items() if c["status"] == "True"} == true
    for t, c in conditions.items():
        shown = c["status"] == "True" or t in ("Ready", "Progressing")
        assert (c["reason"], c["message"]) == ((reason, f"why {reason}") if shown
                                               else (f"Not{t}", ""))
        assert c["lastTransitionTime"] == T0 and c["observedGeneration"] == 3
    # The same facts again change nothing: no write.
    assert derive_status(status, facts, 3, T1) == {}


def test_a_condition_that_holds_keeps_its_transition_time() -> None:
    pending = apply_status_patch({}, derive_status(
        {}, StatusFacts(PhaseView(Phase.PENDING, Reason.CREATING_CLUSTER, "c")), 1, T0))
    starting = derive_status(
        pending, StatusFacts(PhaseView(Phase.STARTING, Reason.PODS_STARTING, "s")), 1, T1)
    times = {c["type"]: c["lastTransitionTime"] for c in starting["conditions"]}
    assert times["Progressing"] == T0  # still True: since Pending
    assert starting["phase"] == Phase.STARTING and "observedGeneration" not in starting


def test_the_record_alone_moves_observed_generation_and_keeps_the_phase() -> None:
    running = apply_status_patch({}, derive_status(
        {}, StatusFacts(PhaseView(Phase.RUNNING, Reason.CLUSTER_RUNNING, "r")), 1, T0))
    patch = derive_status(running, StatusFacts(record={"rayCluster": {"name": "j-a0",
                                                                      "state": "ready"}}),
                          2, T1)
    assert patch == {"observedGeneration": 2, "rayCluster": {"name": "j-a0", "state": "ready"}}
    assert derive_status(running, StatusFacts(record={"nextAttempt": None}), 1, T1) == {}


def test_the_trainers_report_alone_does_not_claim_the_spec_was_observed() -> None:
    running = apply_status_patch({}, derive_status(
        {}, StatusFacts(PhaseView(Phase.RUNNING, Reason.CLUSTER_RUNNING, "r")), 1, T0))
    grown = {"type": "MemoryGrowth", "status": "True", "reason": Reason.SUSTAINED_GROWTH,
             "message": "rss grows", "lastTransitionTime": T1, "observedGeneration": 1}
    reported = [*running["conditions"], grown]
    patch = derive_status(running, StatusFacts(reported=reported), 2, T1)
    assert patch == {"conditions": reported}
    apply_status_patch(running, patch)


def _writes_around_derive(tree: ast.AST) -> list[str]:
    """Status written outside derive_status: `x.status[...] = ...`, `x.status = {...}`,
    Action(status=...) or Action({...}), and any call of a second status builder."""
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for t in targets:
            inner = t.value if isinstance(t, ast.Subscript) else t
            if isinstance(inner, ast.Attribute) and inner.attr == "status" and not (
                    isinstance(node.value, ast.Call)
                    and getattr(node.value.func, "id", None) == "derive_status"):
                found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and ast.unparse(node.func).endswith("status_patch"):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Action" and (
                any(k.arg == "status" for k in node.keywords)
                or any(isinstance(a, ast.Dict) for a in node.args)):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_reconcile_step_writes_status_around_derive_status() -> None:
    found = {f"{p.name}:{w}" for p in RECONCILE.glob("*.py")
             for w in _writes_around_derive(ast.parse(p.read_text()))}
    assert found == set()
