"""Kubernetes users' expectations of a GRPOJob: Kueue's queue label names its queue (as on
Kueue's own jobs), and spec.pods takes schedulerName and topologySpreadConstraints onto
every Ray pod."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from grpo_api.contract import KUEUE_QUEUE_LABEL
from grpo_api.job import parse_spec
from grpo_operator.reconcile import planned
from grpo_operator.render import JobRef, render_ray_cluster
from grpo_operator.webhook import queue_from_label, queue_label_problem
from grpo_testbed.examples import example_job

pytestmark = pytest.mark.unit

LABEL = {KUEUE_QUEUE_LABEL: "team-a"}


def test_the_kueue_label_becomes_the_queue_of_a_new_job() -> None:
    assert queue_from_label(LABEL, {}) == "team-a"
    assert queue_from_label(LABEL, {"queueName": "team-a"}) is None  # already there
    assert queue_from_label({}, {}) is None
    assert queue_label_problem(LABEL, {"queueName": "team-a"}, None) is None
    assert queue_label_problem({}, {"queueName": "team-a"}, None) is None


def test_a_label_and_a_queue_name_that_disagree_are_refused_naming_both() -> None:
    problem = queue_label_problem(LABEL, {"queueName": "team-b"}, None)
    assert problem is not None
    assert f"metadata.labels[{KUEUE_QUEUE_LABEL}] 'team-a' and spec.queueName 'team-b'" \
        in problem
    late = queue_label_problem(LABEL, {}, {})  # added by an update: the queue was fixed
    assert late is not None and "added after the job was created" in late


def test_an_update_that_keeps_the_label_is_not_refused() -> None:
    """A job labelled before its label was recorded as spec.queueName (no queueName) can
    still be updated, its finalizer removed included: the label did not change."""
    assert queue_label_problem(LABEL, {}, LABEL) is None
    assert queue_label_problem(LABEL, {"queueName": "team-b"}, LABEL) is None


def _pods(pods: dict[str, Any]) -> list[dict[str, Any]]:
    spec = copy.deepcopy(example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"])
    spec["pods"] = pods
    parsed = parse_spec(spec)
    rc = render_ray_cluster(parsed, planned(parsed), JobRef("j", "ns", "u"), 0)
    return [rc["spec"]["headGroupSpec"]["template"]["spec"],
            *[g["template"]["spec"] for g in rc["spec"]["workerGroupSpecs"]]]


def test_scheduler_name_and_topology_spread_reach_the_pods() -> None:
    spread = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
              "whenUnsatisfiable": "ScheduleAnyway",
              "labelSelector": {"matchLabels": {"grpo.dev/job": "j", "grpo.dev/role": "worker"}}}
    head, *workers = _pods({"common": {"schedulerName": "volcano"},
                            "workers": {"topologySpreadConstraints": [spread]}})
    assert head["schedulerName"] == "volcano" and "topologySpreadConstraints" not in head
    assert workers and all(w["schedulerName"] == "volcano" for w in workers)
    assert all(w["topologySpreadConstraints"] == [spread] for w in workers)
    head, *workers = _pods({})
    assert "schedulerName" not in head and "schedulerName" not in workers[0]
