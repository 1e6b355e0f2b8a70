"""The reconcile recorder and replayer (grpo_testbed.reconcile_replay): a recorded call
replays without a difference on the same code, and a decision that changed is found."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from grpo_operator import reconcile as rec
from grpo_operator.config import OperatorConfig
from grpo_testbed.examples import example_job
from grpo_testbed.reconcile_replay import install_recorder, records, replay

pytestmark = pytest.mark.unit
T0 = "2026-11-29T10:00:00.000Z"


def test_a_recorded_call_replays_and_a_changed_decision_is_counted(tmp_path: Path) -> None:
    package = types.ModuleType("recorded")
    package.reconcile = rec.reconcile  # type: ignore[attr-defined]
    install_recorder(package, tmp_path)
    job = {**example_job(), "status": {}}
    job["metadata"] |= {"namespace": "ns", "uid": "u1", "generation": 1}
    config = OperatorConfig(default_image="registry.example/trainer:test")
    action = package.reconcile(job, rec.Observed(hub=rec.HubAnswer("u", error="down", retry=True)),
                               rec.SpecChanged(), T0, config)
    assert action.status["phase"]
    assert replay(tmp_path) == (1, [])

    (path,) = tmp_path.glob("*.jsonl")
    (line,) = records(tmp_path)
    line["out"]["status"]["phase"] = "Running"  # what the code before had decided
    path.write_text(json.dumps(line) + "\n")
    calls, found = replay(tmp_path)
    assert calls == 1 and [(d.event, d.field) for d in found] == [("SpecChanged", "status")]
