"""The Ray pods' SIGTERM grace period covers the checkpoint save the trainer makes on
SIGTERM: predicted from the plan's checkpoint bytes, then measured (status.progress.
saveSeconds) from the next attempt on; shown in `grpo plan` and status.plan."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from grpo_api.contract import FailureReason as R
from grpo_api.job import parse_spec
from grpo_api.job.status import GRPOJobStatus
from grpo_operator.cli import cli
from grpo_operator.planner import plan_memory
from grpo_operator.planner.save_time import (
    GRACE_MAX_S,
    GRACE_MIN_S,
    SAVE_GIB_PER_S,
    predicted_save_s,
    termination_grace_s,
)
from grpo_operator.reconcile import Action, StoredStatus, read_status
from grpo_operator.reconcile.attempts import ensure_attempt, finish_attempt
from grpo_operator.reconcile.attempts import start_next_attempt as start
from grpo_operator.reconcile.classify import PodOutcome
from grpo_operator.reconcile.planning import Planner
from grpo_operator.render import JobRef
from grpo_testbed.status_patch import apply_status_patch

pytestmark = pytest.mark.unit
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
JOB = JobRef("j", "ns", "u1")
T0 = "2026-11-21T10:00:00Z"


def spec(example: str) -> dict[str, Any]:
    return dict(yaml.safe_load((EXAMPLES / example).read_text())["spec"])


def first_attempt(sp: dict[str, Any]) -> Action:
    first = ensure_attempt(JOB, Planner(sp).plan([], None), GRPOJobStatus(), T0)
    return first.derive(StoredStatus(), 1, T0)


def graces(children: list[dict[str, Any]]) -> list[int]:
    rc = next(c for c in children if c["kind"] == "RayCluster")["spec"]
    groups = [rc["headGroupSpec"], *rc.get("workerGroupSpecs", [])]
    return [g["template"]["spec"]["terminationGracePeriodSeconds"] for g in groups]


def test_a_72b_jobs_pods_wait_for_its_predicted_save_a_tiny_jobs_for_the_minimum() -> None:
    big = first_attempt(spec("grpojob-qwen2vl-72b-h100.yaml"))
    plan = plan_memory(parse_spec(spec("grpojob-qwen2vl-72b-h100.yaml")))
    # 8 ranks a node each write ~12.8 GiB of fp32 weights and Adam state.
    node_gib = plan.budget.checkpoint_rank_gib * plan.geometry.ranks_per_node
    assert node_gib > 90
    assert predicted_save_s(plan) >= node_gib / SAVE_GIB_PER_S
    want = termination_grace_s(plan)
    assert want > 1.5 * node_gib / SAVE_GIB_PER_S
    # The head, rank 0's worker and the others alike.
    assert graces(big.children) == [want, want, want]
    assert big.status["plan"]["terminationGraceSeconds"] == want
    tiny = first_attempt(spec("grpojob-tiny.yaml"))
    (small,) = set(graces(tiny.children))  # a few MiB to write: the floor
    assert GRACE_MIN_S <= small <= GRACE_MIN_S + 1 < want


def test_the_measured_save_sizes_the_next_attempts_grace_within_bounds() -> None:
    sp = spec("grpojob-qwen2vl-72b-h100.yaml")
    status = apply_status_patch({}, first_attempt(sp).status)
    status["progress"] = {"step": 10, "lastCheckpointStep": 10, "saveSeconds": 400.0}
    stored = read_status(status)
    ended = finish_attempt(stored.status, PodOutcome(R.TERMINATED, 143, "terminated", 10, 10),
                           T0, Planner(sp))
    status = apply_status_patch(status, ended.derive(stored, 1, T0).status)
    nxt = start(JOB, Planner(sp), read_status(status).status, "2026-11-21T11:00:00Z")
    assert nxt is not None
    nxt.derive(read_status(status), 1, "2026-11-21T11:00:00Z")
    assert nxt is not None
    assert graces(nxt.children) == [630, 630, 630]  # 1.5 x 400 s + 30 s, every group
    assert nxt.status["plan"]["terminationGraceSeconds"] == 630
    plan = plan_memory(parse_spec(sp))
    assert termination_grace_s(plan, 5000.0) == GRACE_MAX_S


def test_grpo_plan_shows_the_grace_period_and_the_predicted_save() -> None:
    result = CliRunner().invoke(cli, ["plan", str(EXAMPLES / "grpojob-qwen2vl-72b-h100.yaml")])
    assert result.exit_code == 0
    plan = plan_memory(parse_spec(spec("grpojob-qwen2vl-72b-h100.yaml")))
    assert f"SIGTERM grace {termination_grace_s(plan)} s" in result.stdout
    as_json = CliRunner().invoke(cli, ["plan", "-o", "json",
                                       str(EXAMPLES / "grpojob-qwen2vl-72b-h100.yaml")])
    assert as_json.exit_code == 0
    assert json.loads(as_json.stdout)["sigterm"] == {
        "predictedSaveSeconds": round(predicted_save_s(plan), 1),
        "terminationGraceSeconds": termination_grace_s(plan)}
