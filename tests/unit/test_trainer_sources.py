"""Where each trainer config path comes from is declared once (grpo_api.job.trainer
SOURCES): a planned knob, a spec field, spec.trainer passed through, or the job's
identity. A path declared twice fails at import; no other module spells a knob's name or
a trainer path; the job's identity reaches the trainer once, as env, and the trainer
sees it as before."""

from __future__ import annotations

import ast
import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import Env
from grpo_api.job import parse_spec
from grpo_api.job import trainer as declared
from grpo_api.job.status import GRPOJobStatus
from grpo_api.job.trainer import IDENTITY_ENV, SOURCES
from grpo_api.knobs import KNOBS, ROLLOUT_TENSOR_PARALLEL
from grpo_operator.planner import plan_memory
from grpo_operator.reconcile.attempts import ensure_attempt
from grpo_operator.reconcile.planning import Planner
from grpo_operator.render import JobRef
from grpo_operator.render.children import identity_env
from grpo_operator.render.trainer_config import trainer_config
from grpo_testbed.examples import example_job
from grpo_trainer.config import ENV_OVERRIDES, build_config

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
JOB = JobRef("j", "ns", "uid-1")
# The declarations themselves: the knobs' names, the trainer paths' sources.
DECLARING = {ROOT / "api/grpo_api/knobs.py", ROOT / "api/grpo_api/job/trainer.py"}


def test_a_path_declared_twice_is_refused_and_each_is_of_one_kind() -> None:
    with pytest.raises(ValueError, match=r"rollout\.tensor_parallel_size is declared twice"):
        declared.one_each([
            declared.planned(ROLLOUT_TENSOR_PARALLEL, "rollout.tensor_parallel_size"),
            declared.rendered("rollout.tensor_parallel_size", "spec.rollout")])
    assert len(SOURCES) > 60
    for s in SOURCES.values():
        kinds = [s.knob is not None, s.passed is not None, s.env is not None]
        assert sum(kinds) <= 1, s
    assert declared.identity("a.b", Env.ATTEMPT, "x").env is Env.ATTEMPT
    assert declared.passed("algorithm.ppoEpochs", "actor.ppo_epochs").field == \
        "spec.algorithm.ppoEpochs"


def test_rollout_tensor_parallel_comes_from_the_plan_and_names_spec_rollout() -> None:
    """Two tables used to disagree here (spec.rollout.rolloutTensorParallel, a field no
    spec has, against spec.rollout) and a dict merge's order decided."""
    source = SOURCES["rollout.tensor_parallel_size"]
    assert source.knob is ROLLOUT_TENSOR_PARALLEL
    assert declared.config_sources()["rollout.tensor_parallel_size"] == "spec.rollout"


def _literals(path: Path, names: set[str]) -> list[str]:
    return [f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and node.value in names]


def test_no_module_spells_a_knob_name_or_a_trainer_path_again() -> None:
    """A knob's name as users write it (camelCase: spec.memory, status.plan, the planner's
    reasons) and each trainer config path are spelled, on the operator's side, in the
    declarations alone (the trainer names its own config's fields in its errors)."""
    names = {k.spec for k in KNOBS if k.spec != k.setting} | set(SOURCES)
    found = [hit for package in ("api", "operator", "testbed")
             for path in sorted((ROOT / package).rglob("*.py")) if path not in DECLARING
             for hit in _literals(path, names)]
    assert found == []
    planted = ROOT / "api/grpo_api/knobs.py"  # the checker sees a spelling
    assert _literals(planted, names)


def _maximal_spec() -> dict[str, Any]:
    """A job that sets every optional trainer path the operator renders."""
    spec = copy.deepcopy(example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"])
    spec |= {"lora": {}, "logging": {"tensorboard": True, "wandb": {"project": "p"},
                                     "mlflow": {"trackingUri": "http://mlflow:5000"}},
             "algorithm": {**spec["algorithm"], "ppoEpochs": 1, "entropyCoef": 0.01,
                           "clipRatioDual": 4.0, "klEstimator": "k3", "normAdvByStd": False,
                           "offpolicyIsCap": 3.0},
             # Disaggregated: rollout.placement, max_staleness and disaggregated rendered.
             "rollout": {"placement": "disaggregated", "maxStaleness": 2,
                         "disaggregated": {"gpuType": "L40S-48GB", "nodes": 1}}}
    spec["data"] = {**spec["data"], "val": "/data/val.parquet"}
    spec["checkpoint"] = {**spec["checkpoint"], "store": {"uri": "s3://ckpt-bucket/jobs"}}
    spec["training"] = {**spec["training"], "valIntervalSteps": 5, "maxSteps": 10,
                        "warmupSteps": 1, "valBeforeTrain": False}
    spec["data"]["promptTemplate"] = "r1v"
    spec["reward"] = {"type": "function", "function": "pkg.mod:score", "batch": True,
                      "kwargs": {"a": 1}, "timeoutSeconds": 5.0, "workers": 1}
    return spec


# reward.http is rendered for a judge (type http), reward.function for the others.
JUDGE_ONLY = {"reward.http"}


def test_every_declared_path_is_set_and_every_set_path_declared() -> None:
    """No stale declaration and no undeclared path: the config the operator renders for a
    job that sets everything holds exactly the declared paths but the identity's."""
    raw = trainer_config(parsed := parse_spec(_maximal_spec()), plan_memory(parsed), JOB)
    paths = {f"{section}.{key}" for section, keys in raw.items() for key in keys}
    assert paths == set(SOURCES) - set(IDENTITY_ENV.values()) - JUDGE_ONLY
    judge = _maximal_spec()
    judge["reward"] = {"type": "http", "http": {"url": "http://judge:8000/score"}}
    raw = trainer_config(parsed := parse_spec(judge), plan_memory(parsed), JOB)
    assert set(raw["reward"]) >= {"http", "type"} and "function" not in raw["reward"]
    assert set(declared.PASSED.values()) <= paths


def test_the_jobs_identity_reaches_the_trainer_once_as_env() -> None:
    """Not in the ConfigMap: as the Ray containers' env, which the driver, the preStop
    hook, the rank actors and the head's hub-fetch step all read; the trainer built from
    the ConfigMap and that env holds the identity, as it did when both carried it."""
    action = ensure_attempt(JOB, Planner(example_job()["spec"]).plan([], None),
                            GRPOJobStatus(), "t")
    cm = next(c for c in action.children if c["kind"] == "ConfigMap")
    raw = yaml.safe_load(cm["data"]["config.yaml"])
    assert not [p for p in IDENTITY_ENV.values()
                if p.split(".")[1] in raw.get(p.split(".")[0], {})]
    assert set(identity_env(JOB, 0)) == set(IDENTITY_ENV)
    assert set(IDENTITY_ENV.items()) <= set(ENV_OVERRIDES.items())  # the trainer's reading
    rc = next(c for c in action.children if c["kind"] == "RayCluster")
    pods = [rc["spec"]["headGroupSpec"], *rc["spec"].get("workerGroupSpecs", [])]
    for group in pods:
        ray = group["template"]["spec"]["containers"][0]
        env = {e["name"]: e["value"] for e in ray["env"] if "value" in e}
        assert set(IDENTITY_ENV) <= set(env), ray["name"]
        cfg = build_config(raw, environ=env)
        assert (cfg.checkpoint.dir, cfg.trainer.job_name, cfg.trainer.job_namespace,
                cfg.trainer.job_uid, cfg.trainer.attempt) == (
            "/checkpoints/ns/j", "j", "ns", "uid-1", 0)
