"""The trainer's memory-growth report becomes the MemoryGrowth condition (pure)."""

from __future__ import annotations

from typing import Any

from grpo_api.contract import Reason
from grpo_api.job import GRPOJobStatus
from grpo_operator.reconcile import read_status
from grpo_operator.reconcile.conditions import conditions_for, memory_growth_conditions
from grpo_operator.reconcile.phases import Finding, phase_view
from grpo_operator.reconcile.stored import wire


def phase_conditions(found: Finding, now: str,
                     previous: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    typed = read_status({"conditions": previous}).status.conditions
    return wire(conditions_for(phase_view(found), found, 1, now, typed))  # type: ignore[no-any-return]


def growth_report(progress: dict[str, Any] | None, conditions: list[dict[str, Any]] | None,
                  now: str) -> list[dict[str, Any]] | None:
    """memory_growth_conditions on the status as stored, its answer as written."""
    status = read_status({"progress": progress, "conditions": conditions}).status
    new = memory_growth_conditions(status.progress, status.conditions, 1, now)
    return None if new is None else wire(new)  # type: ignore[no-any-return]


T0, T1 = "2026-11-22T00:00:00Z", "2026-11-22T00:05:00Z"
RUNNING = phase_conditions(Finding(Reason.CLUSTER_RUNNING, "ok"), T0)
MSG = "host RSS of rank 1 grew 4.1 MB/step over the last 20 steps"


def growth(conds: list[dict[str, object]] | None) -> dict[str, object] | None:
    return next((c for c in conds or [] if c["type"] == "MemoryGrowth"), None)


def test_a_growth_report_sets_the_condition_with_the_trainers_message() -> None:
    new = growth_report({"step": 30, "memoryGrowth": MSG}, RUNNING, T1)
    assert new is not None
    c = growth(new)
    assert c is not None
    assert (c["status"], c["reason"], c["message"]) == ("True", "SustainedGrowth", MSG)
    assert [x["type"] for x in new[:len(RUNNING)]] == [x["type"] for x in RUNNING]  # untouched
    GRPOJobStatus.model_validate({"conditions": new})  # what the CRD schema accepts


def test_nothing_to_write_without_a_report_or_when_already_set() -> None:
    assert growth_report({"step": 3}, RUNNING, T1) is None
    assert growth_report(None, RUNNING, T1) is None
    flagged = growth_report({"memoryGrowth": MSG}, RUNNING, T0)
    assert growth_report({"memoryGrowth": MSG}, flagged, T1) is None


def test_a_clean_report_clears_it_and_the_transition_time_moves() -> None:
    flagged = growth_report({"memoryGrowth": MSG}, RUNNING, T0)
    cleared = growth_report({"step": 40}, flagged, T1)
    c = growth(cleared)
    assert c is not None and c["status"] == "False" and c["lastTransitionTime"] == T1


def test_the_operators_own_condition_rewrite_keeps_memory_growth() -> None:
    flagged = growth_report({"memoryGrowth": MSG}, RUNNING, T0)
    rewritten = phase_conditions(Finding(Reason.HOST_OOM, "oom"), T1, flagged)
    c = growth(rewritten)
    assert c is not None and c["status"] == "True" and c["message"] == MSG


def test_growth_set_then_cleared_through_the_trainers_real_patches() -> None:
    """The trainer's own report bodies, merged as the API server merges them: a report
    without growth must clear the condition (an omitted key would keep the old value)."""
    from grpo_testbed.status_patch import apply_status_patch
    from grpo_trainer.liveness.progress import Progress

    status: dict[str, object] = {"conditions": RUNNING}
    grown = Progress(30, 100, 0.5, 25, updated_at=T0, memory_growth=MSG).to_status()
    status = apply_status_patch(status, {"progress": grown})
    flagged = growth_report(status["progress"], RUNNING, T0)  # type: ignore[arg-type]
    assert flagged is not None and growth(flagged)["status"] == "True"  # type: ignore[index]
    status = apply_status_patch(status, {"conditions": flagged})
    calm = Progress(31, 100, 0.5, 25, updated_at=T1).to_status()
    status = apply_status_patch(status, {"progress": calm})
    assert "memoryGrowth" not in status["progress"]  # type: ignore[operator]
    cleared = growth_report(status["progress"], flagged, T1)  # type: ignore[arg-type]
    assert cleared is not None and growth(cleared)["status"] == "False"  # type: ignore[index]
