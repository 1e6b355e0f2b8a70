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


def test_the_trainer_metrics_port_is_always_served_and_declared_by_its_name() -> None:
    spec = load_manifest(ROOT / "examples/grpojob-qwen25vl-7b-h100.yaml").spec
    children = render_children(spec, plan_memory(spec), JobRef("j", "ns", "u"), 0)
    config = next(c for c in children if c["kind"] == "ConfigMap")["data"]["config.yaml"]
    port = yaml.safe_load(config)["metrics"]["prometheus_port"]
    head = next(c for c in children if c["kind"] == "RayCluster")["spec"]["headGroupSpec"]
    (declared,) = head["template"]["spec"]["containers"][0]["ports"]
    assert port and declared["containerPort"] == port
    doc = " ".join((ROOT / "docs/deployment.md").read_text().split())
    assert f"the driver serves `/metrics` on port {port} of every job's Ray head pod" in doc
    assert "no spec field sets or turns it off" in doc
    assert f"declares as its port `{declared['name']}`" in doc


def test_the_docs_list_what_can_change_on_a_live_job_as_the_webhook_decides() -> None:
    """One list, in docs/configuration.md, equal to what the webhook lets change."""
    import re

    from grpo_operator.webhook import IMMUTABLE_SECTIONS, MUTABLE_SECTIONS

    doc = " ".join((ROOT / "docs/configuration.md").read_text().split())
    section = doc.split("## What can change on a live job", 1)[1].split("##", 1)[0]
    may, refused = section.split("may change on a live job", 1)
    assert re.findall(r"`(\w+)`", may) == list(MUTABLE_SECTIONS)
    assert set(IMMUTABLE_SECTIONS) | {"queueName"} <= set(re.findall(r"`(\w+)`", refused))
    troubleshooting = (ROOT / "docs/troubleshooting.md").read_text()
    assert "configuration.md#what-can-change-on-a-live-job" in troubleshooting
