"""One admission truth: every spec the API server stores either is refused by the webhook
with the field named, or reconcile plans and renders it (never an exception, never a
job without a status).

Specs are drawn from the CRD's own schema: each example job, with any of its scalar
fields (and the planner's `auto` knobs) set to values the schema allows (its enums,
bounds and booleans), so the API server would store every one of them.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from grpo_api.job import SpecError, parse_spec
from grpo_operator import reconcile as rec
from grpo_operator.config import OperatorConfig
from grpo_operator.crd import open_api_schema
from grpo_operator.reconcile import Observed
from grpo_operator.webhook import admission_problem
from grpo_testbed.status_patch import apply_status_patch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIG = OperatorConfig(default_image="registry.example/trainer:test")
T0 = "2026-11-24T10:00:00.000Z"
# Sections whose absent scalar fields are drawn too: the knobs users pin by hand.
OPEN_SECTIONS = ("memory", "algorithm", "training", "resources", "rollout", "checkpoint",
                 "recovery")


def _examples() -> list[dict[str, Any]]:
    docs = [yaml.safe_load(p.read_text()) for p in sorted(EXAMPLES.glob("grpojob-*.yaml"))]
    return [d["spec"] for d in docs if d and d.get("kind") == "GRPOJob"]


def _scalar(schema: dict[str, Any]) -> st.SearchStrategy[Any] | None:
    """Values the API server accepts for a scalar field, or None for other fields."""
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    kind = schema.get("type")
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        lo = int(schema.get("minimum", 0))
        return st.integers(lo, int(schema.get("maximum", lo + 4096)))
    if kind == "number":
        lo = float(schema.get("minimum", 0.0))
        return st.floats(lo, float(schema.get("maximum", lo + 1e4)), allow_nan=False)
    return None


def _leaves(schema: dict[str, Any], value: Any, path: tuple[str, ...],
            open_: bool) -> list[tuple[tuple[str, ...], st.SearchStrategy[Any]]]:
    """Every scalar field of `value` (and, in open sections, of its schema) with the
    values its schema allows."""
    out = []
    for name, sub in (schema.get("properties") or {}).items():
        here = (*path, name)
        present = isinstance(value, dict) and name in value
        strategy = _scalar(sub)
        if strategy is not None and (present or open_):
            out.append((here, strategy))
        elif sub.get("type") == "object" and (present or name in OPEN_SECTIONS):
            out += _leaves(sub, value.get(name) if present else {}, here,
                           open_ or name in OPEN_SECTIONS)
    return out


SPEC_SCHEMA = open_api_schema()["properties"]["spec"]


@st.composite
def stored_specs(draw: st.DrawFn) -> dict[str, Any]:
    """A spec the API server would store: an example with some fields redrawn."""
    spec = copy.deepcopy(draw(st.sampled_from(_examples())))
    leaves = _leaves(SPEC_SCHEMA, spec, (), False)
    for path, values in draw(st.lists(st.sampled_from(leaves), max_size=6, unique_by=str)):
        node = spec
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = draw(values)
    return spec


def _job(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
            "metadata": {"name": "prop", "namespace": "ns", "uid": "u", "generation": 1,
                         "resourceVersion": "1"}, "spec": spec, "status": {}}


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(stored_specs())
def test_every_stored_spec_is_refused_with_its_field_or_reconciles(spec: dict[str, Any]
                                                                    ) -> None:
    try:
        parse_spec(spec)
    except SpecError:
        return  # the models (and so the CRD and the webhook) refuse it: never stored
    problem = admission_problem(spec, None)
    if problem is not None:
        assert "spec." in problem or "planner refuses" in problem, problem
        return
    shared = {"spec": {"accessModes": ["ReadWriteMany"]}}  # the claims it names exist
    observed = Observed(claim=shared if spec.get("checkpoint", {}).get("claimName") else None,
                        model_claim=shared if spec["model"].get("claimName") else None)
    action = rec.reconcile(_job(spec), observed, rec.SpecChanged(), T0, CONFIG)
    status = apply_status_patch({}, action.status)  # a write the API server accepts
    assert status["phase"] == "Pending", status.get("conditions")
    assert [c["kind"] for c in action.children][-1] == "RayCluster"


def test_an_exception_in_pure_code_fails_the_job_once_with_its_message() -> None:
    """Not a job without a status, retried by Kopf forever."""
    job = _job(copy.deepcopy(_examples()[0]))
    bad_pod = {"metadata": {"labels": {"grpo.dev/attempt": "0"}}, "status": "nonsense"}
    job["status"] = {"phase": "Running", "attempt": 0,
                     "attempts": [{"index": 0, "startTime": T0, "outcome": "Running"}]}
    action = rec.reconcile(job, Observed(), rec.PodChanged(bad_pod), T0, CONFIG)
    status = apply_status_patch(job["status"], action.status)
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert status["phase"] == "Failed" and failed["reason"] == "InternalError"
    assert "AttributeError" in failed["message"] and action.events[0][1] == "InternalError"
    job["status"] = status
    assert rec.reconcile(job, Observed(), rec.PodChanged(bad_pod), T0, CONFIG) == rec.Action()


def test_a_pinned_micro_batch_the_trainer_cannot_use_is_refused_naming_the_spec_field(
        ) -> None:
    """Found by the property above: admitted, then reconcile raised on every retry."""
    spec = copy.deepcopy(next(s for s in _examples() if s["resources"].get("gpusPerNode") == 8))
    spec.setdefault("memory", {})["microBatchSize"] = 3
    problem = admission_problem(spec, None)
    assert problem is not None and "spec.memory.microBatchSize: " in problem, problem
    assert "must divide" in problem


def test_prompts_that_do_not_split_over_the_ranks_are_refused_naming_the_spec_fields(
        ) -> None:
    """Found by the property above: 2 prompts per step cannot be shared by 8 ranks."""
    spec = copy.deepcopy(next(s for s in _examples() if s["resources"].get("gpusPerNode") == 8))
    spec["training"].update(rolloutBatchSize=2, globalBatchSize=8)
    spec.setdefault("algorithm", {})["rolloutN"] = 4  # 8 responses: one update of 8
    problem = admission_problem(spec, None)
    assert problem is not None and "spec.training.rolloutBatchSize" in problem, problem
    assert "spec.resources.nodes x spec.resources.gpusPerNode" in problem


def test_a_group_of_one_is_refused_at_apply() -> None:
    spec = copy.deepcopy(_examples()[0])
    spec.setdefault("algorithm", {})["rolloutN"] = 1
    problem = admission_problem(spec, None)
    assert problem is not None and "spec.algorithm.rolloutN" in problem
    rollout_n = SPEC_SCHEMA["properties"]["algorithm"]["properties"]["rolloutN"]
    assert rollout_n["minimum"] == 2  # the API server refuses it before the webhook
