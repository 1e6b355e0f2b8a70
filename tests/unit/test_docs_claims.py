"""What docs/deployment.md says about the trainer's pods, checked against what the
operator renders (the RBAC table is checked in test_chart_render.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grpo_api.job import load_manifest
from grpo_operator.planner import plan_memory
from grpo_operator.render import JobRef, render_children

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


def test_the_trainer_metrics_port_is_always_served_and_declared_nowhere() -> None:
    spec = load_manifest(ROOT / "examples/grpojob-qwen25vl-7b-h100.yaml").spec
    children = render_children(spec, plan_memory(spec), JobRef("j", "ns", "u"), 0)
    config = next(c for c in children if c["kind"] == "ConfigMap")["data"]["config.yaml"]
    port = yaml.safe_load(config)["metrics"]["prometheus_port"]
    head = next(c for c in children if c["kind"] == "RayCluster")["spec"]["headGroupSpec"]
    assert port and "ports" not in head["template"]["spec"]["containers"][0]
    doc = " ".join((ROOT / "docs/deployment.md").read_text().split())
    assert f"the driver serves `/metrics` on port {port} of every job's Ray head pod" in doc
    assert "no spec field sets or turns it off" in doc
    assert "declares no `containerPort` for it" in doc
