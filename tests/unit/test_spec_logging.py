"""spec.logging reaches the trainer config and the head pod: TensorBoard beside the
checkpoints, wandb and MLflow runs keyed by the job's uid (so attempts resume one run),
the wandb API key from its Secret on the head only."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from grpo_api.job.status import GRPOJobStatus
from grpo_operator.reconcile.attempts import ensure_attempt
from grpo_operator.reconcile.planning import Planner
from grpo_operator.render import JobRef
from grpo_operator.webhook import admission_problem
from grpo_testbed.examples import example_job

pytestmark = pytest.mark.unit

GPU = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]
JOB = JobRef("geo", "team", "0f1e2d3c-uid")
LOGGING = {"tensorboard": True,
           "wandb": {"project": "geo3k", "entity": "lab", "apiKeySecret": "wandb"},
           "mlflow": {"trackingUri": "http://mlflow.mlflow:5000"}}


def with_logging(logging: dict[str, Any], **extra: Any) -> dict[str, Any]:
    spec = copy.deepcopy(GPU)
    spec["logging"] = logging
    spec.update(extra)
    return spec


def rendered(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    d = ensure_attempt(JOB, Planner(spec).plan([], None), GRPOJobStatus(), "2026-01-01T00:00:00Z",
                       "img")
    assert d.children, d.status
    return {c["kind"]: c for c in d.children}


def test_each_sink_is_configured_for_the_job() -> None:
    kids = rendered(with_logging(LOGGING))
    metrics = yaml.safe_load(kids["ConfigMap"]["data"]["config.yaml"])["metrics"]
    home = "/checkpoints/team/geo"
    assert metrics["tensorboard_dir"] == f"{home}/tensorboard"
    assert metrics["wandb"] == {"project": "geo3k", "entity": "lab", "run_id": JOB.uid,
                                "run_name": "geo", "dir": home}
    assert metrics["mlflow"] == {"tracking_uri": "http://mlflow.mlflow:5000",
                                 "experiment": "team/geo", "run_key": JOB.uid,
                                 "run_name": "geo"}


def test_no_logging_configures_no_sink() -> None:
    kids = rendered(with_logging({}))
    metrics = yaml.safe_load(kids["ConfigMap"]["data"]["config.yaml"])["metrics"]
    assert not {"tensorboard_dir", "wandb", "mlflow"} & set(metrics)


def env_of(kids: dict[str, dict[str, Any]], group: str) -> list[dict[str, Any]]:
    spec = kids["RayCluster"]["spec"]
    g = spec["headGroupSpec"] if group == "head" else spec["workerGroupSpecs"][0]
    return list(g["template"]["spec"]["containers"][0]["env"])


def test_the_wandb_key_comes_from_its_secret_on_the_head_only() -> None:
    kids = rendered(with_logging(LOGGING))
    key = {"name": "WANDB_API_KEY",
           "valueFrom": {"secretKeyRef": {"name": "wandb", "key": "apiKey"}}}
    assert key in env_of(kids, "head")
    assert all(e["name"] != "WANDB_API_KEY" for e in env_of(kids, "worker"))
    without = rendered(with_logging({"wandb": {"project": "geo3k"}}))
    assert all(e["name"] != "WANDB_API_KEY" for e in env_of(without, "head"))


def test_a_key_also_set_in_spec_pods_is_refused_naming_it() -> None:
    pods = {"head": {"env": [{"name": "WANDB_API_KEY", "value": "k"}]}}
    problem = admission_problem(with_logging(LOGGING, pods=pods), None)
    assert problem is not None
    assert "spec.pods.head.env[0].name: WANDB_API_KEY is set by the operator" in problem
    # Without apiKeySecret the pods' env is where the key (or WANDB_MODE) comes from.
    assert admission_problem(with_logging({"wandb": {"project": "p"}}, pods=pods), None) is None


def test_logging_may_change_on_a_live_job() -> None:
    assert admission_problem(with_logging(LOGGING), with_logging({})) is None
