"""Admission checks the pods reconcile creates: the RayCluster it renders alone (to read
its pod templates against the namespace's rules) is the one render_children makes for
the first attempt, for every example job; and the one-parse review answers what the
separate problem and warnings functions answer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.job import parse_spec
from grpo_operator.namespace_policy import NamespaceFacts
from grpo_operator.reconcile import planned
from grpo_operator.render import JobRef, render_children, render_ray_cluster
from grpo_operator.webhook import admission_problem, admission_warnings, review_admission

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _example_specs() -> list[tuple[str, dict[str, Any]]]:
    out = []
    for path in sorted(EXAMPLES.glob("grpojob-*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "GRPOJob":
                out.append((path.name, doc["spec"]))
    return out


SPECS = _example_specs()


@pytest.mark.parametrize(("example", "spec"), SPECS, ids=[n for n, _ in SPECS])
def test_admission_renders_the_ray_cluster_reconcile_creates(
    example: str, spec: dict[str, Any]
) -> None:
    parsed = parse_spec(spec)
    plan = planned(parsed)
    job = JobRef("j", "ns", "uid-1")
    clusters = [c for c in render_children(parsed, plan, job, 0, "img:1")
                if c["kind"] == "RayCluster"]
    assert clusters == [render_ray_cluster(parsed, plan, job, 0, "img:1")]


@pytest.mark.parametrize(("example", "spec"), SPECS, ids=[n for n, _ in SPECS])
def test_one_review_answers_as_problem_and_warnings_do(
    example: str, spec: dict[str, Any]
) -> None:
    facts = NamespaceFacts("ns", {"pod-security.kubernetes.io/enforce": "restricted"}, ())
    for body in (spec, {**spec, "memory": {"nope": 1}}):
        review = review_admission(body, None, namespace=facts)
        assert review.problem == admission_problem(body, None, namespace=facts)
        assert review.warnings == ([] if review.problem else admission_warnings(body))
