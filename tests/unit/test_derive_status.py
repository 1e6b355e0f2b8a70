"""The status is derived in one place (reconcile/status.py, as KubeRay's
calculateStatus), the phase and its conditions by one table (reconcile/phases.py): one
row per phase and reason a user sees, each patch merged and checked against the CRD's
schema as the API server would."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from grpo_api.contract import PHASE_CONDITIONS, FailureReason, KueueReason, Phase, Reason
from grpo_api.job.status import RayClusterStatus
from grpo_operator.reconcile import StoredStatus, read_status
from grpo_operator.reconcile.phases import PHASE_OF, Finding
from grpo_operator.reconcile.status import StatusFacts, derive_status
from grpo_testbed.status_patch import apply_status_patch

pytestmark = pytest.mark.unit
RECONCILE = Path(__file__).resolve().parents[2] / "operator/grpo_operator/reconcile"
T0, T1 = "2026-11-26T10:00:00.000Z", "2026-11-26T10:05:00.000Z"

FINAL, REQUEUED = {"final": True}, {"requeued": True}
# (what a step found: its reason and facts; the phase a user sees, the conditions True)
ROWS: list[tuple[Reason | KueueReason, dict[str, bool], Phase, set[str]]] = [
    (Reason.CREATING_CLUSTER, {}, Phase.PENDING, {"Progressing"}),
    (Reason.WAITING_FOR_PODS, {}, Phase.PENDING, {"Progressing"}),
    (Reason.UNSCHEDULABLE, {}, Phase.PENDING, {"Progressing"}),
    (Reason.CLAIM_MISSING, {}, Phase.PENDING, {"Progressing"}),
    (Reason.WAITING_FOR_PREVIOUS_JOB, {}, Phase.PENDING, {"Progressing"}),
    (Reason.READING_MODEL_CONFIG, {}, Phase.PENDING, {"Progressing"}),
    (Reason.MODEL_CONFIG_UNAVAILABLE, {}, Phase.PENDING, {"Progressing", "Degraded"}),
    (Reason.CREATE_FAILED, {}, Phase.PENDING, {"Progressing", "Degraded"}),
    (Reason.POD_CREATE_REFUSED, {}, Phase.PENDING, {"Progressing", "Degraded"}),
    (Reason.WAITING_FOR_WORKLOAD, {}, Phase.QUEUED, {"Queued"}),
    (Reason.ADMISSION_CHECKS_PENDING, {}, Phase.QUEUED, {"Queued"}),
    (Reason.PENDING, {}, Phase.QUEUED, {"Queued"}),
    (KueueReason("Pending"), {}, Phase.QUEUED, {"Queued"}),
    (KueueReason("QuotaReserved"), {}, Phase.QUEUED, {"Queued"}),
    (Reason.PREEMPTED, REQUEUED, Phase.QUEUED, {"Queued"}),
    (Reason.PODS_STARTING, {}, Phase.STARTING, {"Progressing"}),
    (Reason.CLUSTER_RUNNING, {}, Phase.RUNNING, {"Ready", "Progressing"}),
    (Reason.CUDA_OOM, {}, Phase.RESTARTING, {"Progressing", "Degraded"}),
    (Reason.PREEMPTED, {}, Phase.RESTARTING, {"Progressing", "Degraded"}),  # a pod's
    (Reason.WAITING_FOR_PREVIOUS_ATTEMPT, {}, Phase.RESTARTING, {"Progressing", "Degraded"}),
    (Reason.SUSPENDED_BY_USER, {}, Phase.SUSPENDED, {"Suspended"}),
    (Reason.TRAINING_FINISHED, {}, Phase.SUCCEEDED, {"Succeeded"}),
    (Reason.HANG, {}, Phase.RESTARTING, {"Progressing", "Degraded"}),
    (Reason.INVALID_NAME, {}, Phase.FAILED, {"Failed"}),
    (Reason.INVALID_SPEC, {}, Phase.FAILED, {"Failed"}),
    (Reason.CONFIG_ERROR, {}, Phase.FAILED, {"Failed"}),
    (Reason.CONFIG_ERROR, FINAL, Phase.FAILED, {"Failed"}),
    (Reason.PREEMPTED, FINAL, Phase.FAILED, {"Failed"}),
    (Reason.INFEASIBLE, {}, Phase.FAILED, {"Failed"}),
    (Reason.POD_CREATE_REFUSED, FINAL, Phase.FAILED, {"Failed"}),
    (Reason.HOST_OOM, FINAL, Phase.FAILED, {"Failed"}),
    (Reason.INTERNAL_ERROR, {}, Phase.FAILED, {"Failed"}),
]


@pytest.mark.parametrize(("reason", "facts", "phase", "true"), ROWS,
                         ids=[f"{r[1] and next(iter(r[1]))}-{r[0]}-{r[2]}" for r in ROWS])
def test_each_finding_derives_its_phase_and_conditions(
        reason: Reason | KueueReason, facts: dict[str, bool], phase: Phase,
        true: set[str]) -> None:
    found = Finding(reason, f"why {reason}", **facts)
    patch = derive_status(StoredStatus(), StatusFacts(found), 3, T0)
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
    assert derive_status(read_status(status), StatusFacts(found), 3, T1) == {}


def test_a_condition_that_holds_keeps_its_transition_time() -> None:
    pending = apply_status_patch({}, derive_status(
        StoredStatus(), StatusFacts(Finding(Reason.CREATING_CLUSTER, "c")), 1, T0))
    starting = derive_status(read_status(pending),
                             StatusFacts(Finding(Reason.PODS_STARTING, "s")), 1, T1)
    times = {c["type"]: c["lastTransitionTime"] for c in starting["conditions"]}
    assert times["Progressing"] == T0  # still True: since Pending
    assert starting["phase"] == Phase.STARTING and "observedGeneration" not in starting


def test_the_record_alone_moves_observed_generation_and_keeps_the_phase() -> None:
    running = apply_status_patch({}, derive_status(
        StoredStatus(), StatusFacts(Finding(Reason.CLUSTER_RUNNING, "r")), 1, T0))
    seen = RayClusterStatus(name="j-a0", state="ready")
    patch = derive_status(read_status(running), StatusFacts(record={"ray_cluster": seen}),
                          2, T1)
    assert patch == {"observedGeneration": 2, "rayCluster": {"name": "j-a0", "state": "ready"}}
    assert derive_status(read_status(running), StatusFacts(record={"next_attempt": None}), 1,
                         T1) == {}


def test_the_trainers_report_alone_does_not_claim_the_spec_was_observed() -> None:
    running = apply_status_patch({}, derive_status(
        StoredStatus(), StatusFacts(Finding(Reason.CLUSTER_RUNNING, "r")), 1, T0))
    grown = {"type": "MemoryGrowth", "status": "True", "reason": Reason.SUSTAINED_GROWTH,
             "message": "rss grows", "lastTransitionTime": T1, "observedGeneration": 1}
    reported = [*running["conditions"], grown]
    typed = read_status({"conditions": reported}).status.conditions
    patch = derive_status(read_status(running), StatusFacts(reported=typed), 2, T1)
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


def _phase_choices(tree: ast.AST) -> list[str]:
    """Where a module could choose a phase: a Phase member anywhere but in a comparison
    with the status's phase (reading it) or in a tuple of phases compared with, and a
    "phase" key written."""
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) == "Phase":
            up = parents.get(node)
            while isinstance(up, ast.Tuple | ast.Starred):
                up = parents.get(up)
            read = isinstance(up, ast.Compare) or (
                isinstance(up, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper()
                                                   for t in up.targets))
            if not read:
                found.append(f"{node.lineno}: {ast.unparse(up or node)}")
        if isinstance(node, ast.Dict) and any(
                isinstance(k, ast.Constant) and k.value == "phase" for k in node.keys):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_step_chooses_a_phase_outside_the_table() -> None:
    """PhaseView literals outside the table: 0. A step reports a Finding; a Phase member
    outside phases.py only reads the status's phase (a comparison, or a constant tuple
    of phases compared with)."""
    found = {f"{p.name}:{w}" for p in RECONCILE.glob("*.py") if p.name != "phases.py"
             for w in _phase_choices(ast.parse(p.read_text()))}
    assert found == set()
    planted = ast.parse("def f(s):\n    if s.get('phase') == Phase.RUNNING:\n"
                        "        return Seen(Phase.FAILED)\n    return {'phase': 'Failed'}\n")
    assert len(_phase_choices(planted)) == 2  # the checker sees a choice


def test_every_reason_a_step_reports_has_its_phase_in_the_table() -> None:
    reported = {ast.unparse(node.args[0]).removeprefix("Reason.")
                for p in RECONCILE.glob("*.py") for node in ast.walk(ast.parse(p.read_text()))
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Finding"
                and node.args and ast.unparse(node.args[0]).startswith("Reason.")}
    assert len(reported) > 15
    assert {r for r in reported if Reason[r] not in PHASE_OF} == set()
    # Reason(outcome): every attempt failure class, restarted unless the job gives up.
    assert {Reason(r) for r in FailureReason if r != FailureReason.SUCCEEDED} <= set(PHASE_OF)
