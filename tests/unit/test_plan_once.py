"""One decision parses the spec once and runs the memory planner at most once: on a spec
change (also when config.json arrives in it), when an attempt fails and is restarted,
and when the next attempt starts; never on the events that need no plan. The count is
the planner's own (its entry point wrapped), and the one the operator exports."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from grpo_api.model_config import shape_fields
from grpo_operator import handlers
from grpo_operator import reconcile as rec
from grpo_operator.config import OperatorConfig
from grpo_operator.reconcile import Action, Observed, planning
from grpo_testbed.examples import example_job
from grpo_testbed.status_patch import apply_status_patch
from grpo_testkit.tiny_configs import write_qwen25_vl_3b

pytestmark = pytest.mark.unit
T0, LATER = "2026-11-29T10:00:00.000Z", "2026-11-29T11:00:00.000Z"
CONFIG = OperatorConfig(default_image="registry.example/trainer:test",
                        hub_endpoints={"acme": "https://hub.acme"})


@pytest.fixture
def runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How often the planner ran (planning.checked_plan: every plan starts there)."""
    seen = [0]
    real = planning.checked_plan

    def counted(*args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(planning, "checked_plan", counted)
    yield seen


def new_job(**spec: Any) -> dict[str, Any]:
    job = example_job("grpojob-qwen25vl-7b-h100.yaml")
    job["spec"] |= spec
    job["spec"] |= {"backoffLimit": 3, "recovery": {"backoff": {"initialSeconds": 30}}}
    job["metadata"] |= {"namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "1"}
    return {**job, "status": {}}


def decide(job: dict[str, Any], event: Any, runs: list[int], now: str = T0,
           observed: Observed | None = None) -> tuple[dict[str, Any], Action, int]:
    """(the job after the decision, the action, the planner's runs for it)."""
    runs[0] = 0
    action = rec.reconcile(job, observed or Observed(), event, now, CONFIG)
    out = copy.deepcopy(job)
    out["status"] = apply_status_patch(out["status"], action.status)
    assert action.plans == runs[0], "the action reports the planner's own count"
    return out, action, runs[0]


def pod(role: str, attempt: int = 0, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": f"j-a{attempt}-{role}", "labels": {
        "grpo.dev/job": "j", "grpo.dev/attempt": str(attempt), "grpo.dev/role": role}},
        "status": {"phase": "Running", **status}}


def test_a_spec_change_plans_once(runs: list[int]) -> None:
    job, action, planned = decide(new_job(), rec.SpecChanged(), runs)
    assert planned == 1 and job["status"]["phase"] == "Pending" and action.children
    job, action, planned = decide(job, rec.SpecChanged(), runs, LATER)  # operator restart
    assert planned == 1 and action.status == {} and action.children


def test_config_json_read_in_the_decision_plans_once_with_it(
        runs: list[int], tmp_path: Path) -> None:
    config = shape_fields(json.loads(write_qwen25_vl_3b(tmp_path / "m").read_text()))
    job = new_job(model={"path": "acme/custom-vl-3b"}, hub={"endpoint": "acme"})
    hub = rec.HubAnswer("https://hub.acme/acme/custom-vl-3b/resolve/main/config.json",
                        config=config)
    job, action, planned = decide(job, rec.SpecChanged(), runs, observed=Observed(hub=hub))
    assert planned == 1 and action.children
    assert job["status"]["modelConfig"]["source"] == "hub"
    assert job["status"]["plan"]["modelSource"].startswith("hub config.json")


def test_a_failed_attempt_and_the_next_one_plan_once_each(runs: list[int]) -> None:
    job, _, _ = decide(new_job(), rec.SpecChanged(), runs)
    job, _, planned = decide(job, rec.ClusterChanged(
        {"metadata": {"name": "j-a0", "labels": {"grpo.dev/job": "j", "grpo.dev/attempt": "0"}},
         "status": {"state": "ready"}}), runs)
    assert planned == 0 and job["status"]["phase"] == "Running"
    job, _, planned = decide(job, rec.JobChanged(), runs)
    assert planned == 0
    oom = pod("head", phase="Failed", containerStatuses=[{"name": "ray", "state": {
        "terminated": {"exitCode": 3, "message": '{"reason": "CudaOOM", "step": 4}'}}}])
    job, action, planned = decide(job, rec.PodChanged(oom), runs)
    assert planned == 1 and job["status"]["phase"] == "Restarting"
    assert job["status"]["attempts"][0]["remediation"]
    job, action, planned = decide(job, rec.BackoffTimer(), runs, LATER)
    assert planned == 1 and job["status"]["attempt"] == 1 and action.children
    job, _, planned = decide(job, rec.SpecChanged(), runs, LATER)  # the live attempt 1
    assert planned == 1


def test_a_spec_that_does_not_parse_is_refused_without_planning(runs: list[int]) -> None:
    job = new_job()
    job["spec"]["resources"]["nodes"] = "two"
    job, _, planned = decide(job, rec.SpecChanged(), runs)
    assert planned == 0 and job["status"]["phase"] == "Failed"
    assert job["status"]["conditions"][0]["reason"] == "InvalidSpec"


def _plans_seen(event: str) -> tuple[float, float]:
    """(decisions, decisions with at most one plan) the operator's metric counts."""
    labels = {"event": event}
    count = REGISTRY.get_sample_value("grpo_operator_plans_per_decision_count", labels)
    once = REGISTRY.get_sample_value("grpo_operator_plans_per_decision_bucket",
                                     {**labels, "le": "1.0"})
    return count or 0.0, once or 0.0


def test_the_operator_exports_the_plans_of_each_decision(runs: list[int]) -> None:
    count, once = _plans_seen("SpecChanged")
    action = handlers._reconcile(new_job(), Observed(), rec.SpecChanged(), T0, CONFIG)
    assert action.plans == 1
    assert _plans_seen("SpecChanged") == (count + 1, once + 1)
    total = REGISTRY.get_sample_value("grpo_operator_plans_per_decision_sum",
                                      {"event": "SpecChanged"})
    assert total is not None and total >= 1
