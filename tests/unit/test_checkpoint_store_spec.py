"""spec.checkpoint.store reaches the job's pods: the trainer config's checkpoint.store
under the job's own prefix, the keys as Secret references on every Ray container and in
no object the operator writes, the export reported as its URI."""

from __future__ import annotations

import copy
import json
import math
import re
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from grpo_api.contract import STORE_KEY_ENV
from grpo_api.job import GRPOJobSpec
from grpo_api.job.status import GRPOJobStatus
from grpo_operator.reconcile.attempts import ensure_attempt
from grpo_operator.reconcile.classify import Exported
from grpo_operator.reconcile.planning import Planner
from grpo_operator.reconcile.retention import export_status
from grpo_operator.render import JobRef
from grpo_operator.webhook import admission_problem
from grpo_testbed.examples import example_job

pytestmark = pytest.mark.unit

GPU = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]
JOB = JobRef("geo", "team", "0f1e2d3c-uid")
STORE = {"uri": "s3://ckpt-bucket/grpo/", "endpoint": "http://minio.storage:9000",
         "region": "eu-west-1", "pathStyle": True, "keysSecret": "s3-keys"}


def with_store(store: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    spec = copy.deepcopy(GPU)
    if store is not None:
        spec["checkpoint"]["store"] = store
    spec.update(extra)
    return spec


def rendered(spec: dict[str, Any]) -> list[dict[str, Any]]:
    d = ensure_attempt(JOB, Planner(spec).plan([], None), GRPOJobStatus(),
                       "2026-01-01T00:00:00Z", "img")
    assert d.children, d.status
    return list(d.children)


def of_kind(kids: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(c for c in kids if c["kind"] == kind)


def ray_containers(kids: list[dict[str, Any]]) -> list[dict[str, Any]]:
    spec = of_kind(kids, "RayCluster")["spec"]
    groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
    return [g["template"]["spec"]["containers"][0] for g in groups]


def test_the_trainer_gets_the_store_under_the_jobs_own_prefix() -> None:
    config = yaml.safe_load(of_kind(rendered(with_store(STORE)), "ConfigMap")
                            ["data"]["config.yaml"])
    assert config["checkpoint"]["store"] == {
        "uri": "s3://ckpt-bucket/grpo/team/geo", "endpoint": "http://minio.storage:9000",
        "region": "eu-west-1", "path_style": True, "keys_secret": "s3-keys",
        "upload_deadline_s": 1800.0, "keep_attempts": False}
    plain = yaml.safe_load(of_kind(rendered(with_store(None)), "ConfigMap")
                           ["data"]["config.yaml"])
    assert "store" not in plain["checkpoint"]


def test_every_ray_container_gets_the_keys_from_the_secret_and_nothing_holds_them() -> None:
    kids = rendered(with_store(STORE))
    refs = [{"name": k, "valueFrom": {"secretKeyRef": {"name": "s3-keys", "key": k}}}
            for k in STORE_KEY_ENV]
    containers = ray_containers(kids)
    assert len(containers) >= 2  # the head and the worker group
    for c in containers:
        assert all(r in c["env"] for r in refs), c["name"]
    # Only references: no value of the keys' names anywhere in the children.
    for e in (e for c in containers for e in c["env"] if e["name"] in STORE_KEY_ENV):
        assert "value" not in e
    # Without a Secret (the pods' identity: IRSA, workload identity) no key env at all.
    anonymous = {k: v for k, v in STORE.items() if k != "keysSecret"}
    for c in ray_containers(rendered(with_store(anonymous))):
        assert not {e["name"] for e in c["env"]} & set(STORE_KEY_ENV)


def test_a_key_also_set_in_spec_pods_is_refused_naming_it() -> None:
    pods = {"workers": {"env": [{"name": "AWS_SECRET_ACCESS_KEY", "value": "k"}]}}
    problem = admission_problem(with_store(STORE, pods=pods), None)
    assert problem is not None and "AWS_SECRET_ACCESS_KEY" in problem, problem


@pytest.mark.parametrize(("store", "field"), [
    ({"uri": "gs://bucket/x"}, "uri"),
    ({"uri": "s3://Bucket_Upper/x"}, "uri"),
    ({"uri": "s3://bucket", "endpoint": "minio:9000"}, "endpoint"),
    ({"uri": "s3://bucket", "keysSecret": "Not_A_Name"}, "keysSecret"),
    ({"uri": "s3://bucket", "uploadDeadlineSeconds": 5}, "uploadDeadlineSeconds"),
    ({"uri": "s3://bucket", "accessKey": "AKIA..."}, "accessKey"),
])
def test_a_bad_store_is_refused_naming_the_field(store: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError, match=field):
        GRPOJobSpec.model_validate(with_store(store))
    problem = admission_problem(with_store(store), None)
    assert problem is not None and field in problem, problem


def test_an_export_to_the_store_is_reported_as_its_uri() -> None:
    uri = "s3://ckpt-bucket/grpo/team/geo/export"
    assert export_status(Exported(uri, 8), "geo-checkpoints").to_wire() == {
        "uri": uri, "step": 8}
    on_claim = export_status(Exported("/checkpoints/team/geo/export", 8), "geo-checkpoints")
    assert on_claim.to_wire() == {"claimName": "geo-checkpoints",
                                  "path": "team/geo/export", "step": 8}
    assert "s3-keys" not in json.dumps(on_claim.to_wire())


def without_claim(store: dict[str, Any] = STORE) -> dict[str, Any]:
    spec = with_store(store)
    for key in ("claimName", "size", "storageClass"):
        spec["checkpoint"].pop(key, None)
    return spec


def pod_templates(kids: list[dict[str, Any]]) -> list[dict[str, Any]]:
    spec = of_kind(kids, "RayCluster")["spec"]
    return [g["template"]["spec"] for g in [spec["headGroupSpec"], *spec["workerGroupSpecs"]]]


def test_with_a_store_and_no_claim_each_pod_stages_on_its_own_disk() -> None:
    """No PVC at all: every Ray pod's checkpoint volume is its own emptyDir, the hub fetch
    runs on each pod (nothing is shared), and the trainer keeps attempts/ in the store."""
    kids = rendered(without_claim())
    assert not [c for c in kids if c["kind"] == "PersistentVolumeClaim"]
    pods = pod_templates(kids)
    for pod in pods:
        (vol,) = [v for v in pod["volumes"] if v["name"] == "checkpoints"]
        assert vol == {"name": "checkpoints", "emptyDir": {}}
        assert [c["name"] for c in pod.get("initContainers") or []] == ["hub-fetch"]
    config = yaml.safe_load(of_kind(kids, "ConfigMap")["data"]["config.yaml"])
    assert config["checkpoint"]["store"]["keep_attempts"] is True
    # With a claim the head alone fetches onto it, for every pod.
    claimed = pod_templates(rendered(with_store(STORE)))
    assert [bool(p.get("initContainers")) for p in claimed] == [True] + [False] * (
        len(claimed) - 1)


def test_the_attempts_logs_are_said_to_be_in_the_store_without_a_claim() -> None:
    d = ensure_attempt(JOB, Planner(without_claim()).plan([], None), GRPOJobStatus(),
                       "2026-01-01T00:00:00Z", "img")
    (record,) = d.facts.record["attempts"]
    assert record.logs == "s3://ckpt-bucket/grpo/team/geo/attempts/0"
    d = ensure_attempt(JOB, Planner(with_store(STORE)).plan([], None), GRPOJobStatus(),
                       "2026-01-01T00:00:00Z", "img")
    (record,) = d.facts.record["attempts"]
    assert record.logs.startswith("geo-checkpoints:team/geo/attempts/0")


@pytest.mark.parametrize(("checkpoint", "problem"), [
    ({"intervalSteps": 5}, "or store (an S3 store; no claim needed)"),
    ({"claimName": "c", "size": "1Gi", "store": {"uri": "s3://bucket"}},
     "set exactly one of claimName"),
])
def test_no_claim_needs_a_store_and_a_store_takes_at_most_one_claim(
        checkpoint: dict[str, Any], problem: str) -> None:
    spec = copy.deepcopy(GPU)
    spec["checkpoint"] = checkpoint
    with pytest.raises(ValidationError, match=re.escape(problem)):
        GRPOJobSpec.model_validate(spec)


def test_without_a_claim_each_pod_requests_the_disk_it_stages_on() -> None:
    """The 7B H100 example without a claim: a worker pod requests its ranks' share of one
    checkpoint, and (rank 0 may land on it) room for the export's whole checkpoint and
    model; the head, which runs no rank, only its logs. A job with a claim requests no
    disk (the claim holds it)."""
    from grpo_operator.planner.staging import STAGING_EXTRA_GIB

    plan = Planner(without_claim()).plan([], None)
    assert plan.plan is not None
    p = plan.plan
    kids = rendered(without_claim())
    head, *workers = ray_containers(kids)
    disk = {c["name"]: c["resources"]["requests"].get("ephemeral-storage") for c in [head]}
    assert disk == {"ray-head": f"{STAGING_EXTRA_GIB}Gi"}
    share = p.budget.checkpoint_rank_gib * p.geometry.ranks_per_node
    whole = p.budget.checkpoint_rank_gib * p.geometry.world_size
    assert share > 50 and whole >= share  # a 7B model's fp32 weights and Adam state
    want = math.ceil(share + 2 * whole + STAGING_EXTRA_GIB)
    for c in workers:
        assert c["resources"]["requests"]["ephemeral-storage"] == f"{want}Gi"
        assert "ephemeral-storage" not in c["resources"]["limits"]  # never evicted for it
    for c in ray_containers(rendered(with_store(STORE))):
        assert "ephemeral-storage" not in c["resources"]["requests"]


def test_s3_data_is_fetched_with_the_stores_settings_before_any_rank_runs() -> None:
    spec = with_store(STORE)
    spec["data"] = {**spec["data"], "train": "s3://data-bucket/geo3k/train.parquet",
                    "val": "s3://data-bucket/geo3k/val.parquet"}
    kids = rendered(spec)
    config = yaml.safe_load(of_kind(kids, "ConfigMap")["data"]["config.yaml"])
    home = "/checkpoints/team/geo"
    assert config["data"]["train_files"] == [f"{home}/hub/s3/data-bucket/geo3k/train.parquet"]
    assert config["data"]["val_files"] == [f"{home}/hub/s3/data-bucket/geo3k/val.parquet"]
    head = pod_templates(kids)[0]
    (fetch,) = head["initContainers"]
    cmd = fetch["command"]
    assert cmd[cmd.index("--s3") + 1] == "s3://data-bucket/geo3k/train.parquet"
    assert cmd.count("--s3") == 2 and "--s3-path-style" in cmd
    assert cmd[cmd.index("--s3-endpoint") + 1] == "http://minio.storage:9000"
    assert cmd[cmd.index("--s3-keys-secret") + 1] == "s3-keys"
    keys = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in fetch["env"]
            if e["name"] in STORE_KEY_ENV}
    assert keys == dict.fromkeys(STORE_KEY_ENV, "s3-keys")


@pytest.mark.parametrize(("data", "store", "field", "words"), [
    ({"train": "s3://data-bucket/train.parquet"}, None, "data",
     "s3:// data is fetched with checkpoint.store's endpoint"),
    ({"train": "gs://data-bucket/train.parquet"}, STORE, "data.train", "only s3:// is read"),
    ({"train": "s3://data-bucket/shards/"}, STORE, "data.train", "names one object"),
])
def test_data_urls_the_trainer_cannot_read_are_refused_naming_the_field(
        data: dict[str, str], store: dict[str, Any] | None, field: str, words: str) -> None:
    spec = with_store(store)
    spec["data"] = {**spec["data"], **data}
    with pytest.raises(ValidationError, match=re.escape(words)) as err:
        GRPOJobSpec.model_validate(spec)
    assert field in str(err.value)


def with_s3_model(store: dict[str, Any] | None = STORE) -> dict[str, Any]:
    spec = with_store(store)
    spec["model"] = {"path": "s3://models-bucket/qwen2.5-vl-7b/"}
    return spec


def test_an_s3_model_is_read_by_a_reader_pod_and_fetched_before_any_rank() -> None:
    from grpo_operator.reconcile.model_config import how_read
    from grpo_operator.render.model_reader import render_model_reader

    spec = with_s3_model()
    assert how_read(spec) == "pod"  # the job's keys are the pods': the operator reads none
    pod = render_model_reader(GRPOJobSpec.model_validate(spec), JOB, None)
    (c,) = pod["spec"]["containers"]
    assert c["command"][:5] == ["python", "-m", "grpo_trainer.store_fetch", "--config-of",
                                "s3://models-bucket/qwen2.5-vl-7b/"]
    assert "--s3-path-style" in c["command"]
    assert {e["name"] for e in c["env"]} >= set(STORE_KEY_ENV)
    kids = rendered(spec)
    config = yaml.safe_load(of_kind(kids, "ConfigMap")["data"]["config.yaml"])
    assert config["model"]["path"] == "/checkpoints/team/geo/hub/s3/models-bucket/qwen2.5-vl-7b"
    (fetch,) = pod_templates(kids)[0]["initContainers"]
    cmd = fetch["command"]
    assert cmd[cmd.index("--s3-model") + 1] == "s3://models-bucket/qwen2.5-vl-7b/"


@pytest.mark.parametrize(("spec", "words"), [
    (with_s3_model(None), "an s3:// model is fetched with checkpoint.store's endpoint"),
    ({**with_s3_model(), "model": {"path": "s3://models-bucket/m/", "claimName": "models"}},
     "and no model.claimName"),
    ({**with_s3_model(), "model": {"path": "s3://Models_Bucket/m/"}}, "is not s3://bucket"),
    ({**with_s3_model(), "model": {"path": "gs://models-bucket/m/"}}, "only s3://bucket"),
])
def test_an_s3_model_the_trainer_cannot_read_is_refused_naming_the_field(
        spec: dict[str, Any], words: str) -> None:
    with pytest.raises(ValidationError, match=re.escape(words)) as err:
        GRPOJobSpec.model_validate(spec)
    assert "model.path" in str(err.value)
