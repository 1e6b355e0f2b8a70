"""A new job's config.json is read once, wherever the model lives, and plans every
attempt; what cannot be read says why and how to fix it (pure: reconcile and admission,
with what the handlers would have gathered). Configs are written by transformers."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import FailureReason
from grpo_api.job.status import GRPOJobStatus
from grpo_api.model_config import ReaderReport, hub_config_url, shape_fields
from grpo_operator import reconcile as rec
from grpo_operator.config import OperatorConfig
from grpo_operator.namespace_policy import pod_violations
from grpo_operator.planner import shape_from_config
from grpo_operator.reconcile import HubAnswer, Observed, Planner, read_status
from grpo_operator.reconcile.attempts import finish_attempt
from grpo_operator.reconcile.classify import PodOutcome
from grpo_operator.reconcile.model_config import READ_POLL_SECONDS, RETRY_SECONDS
from grpo_operator.webhook import admission_problem, admission_warnings
from grpo_testbed.status_patch import apply_status_patch
from grpo_testkit.tiny_configs import write_config, write_qwen25_vl_3b

pytestmark = pytest.mark.unit

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "grpojob-qwen25vl-7b-h100.yaml"
T0 = "2026-11-21T10:00:00.000Z"
NEW = GRPOJobStatus()  # a new job's status: nothing read, nothing planned
REPO = "acme/custom-vl-3b"  # in no table
HUB = "https://hub.acme.example"
HUBS = {"acme": HUB}  # the platform's hubEndpoints: jobs name the hub "acme"
CONFIG = OperatorConfig(default_image="registry.example/trainer:test", hub_endpoints=HUBS)
URL = hub_config_url(HUB, REPO, None)
POD = "j-model-config"


@pytest.fixture(scope="module")
def vl3b(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    path = write_qwen25_vl_3b(tmp_path_factory.mktemp("hub") / REPO)
    return shape_fields(json.loads(path.read_text()))


def new_job() -> dict[str, Any]:
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1,
                         "resourceVersion": "1"},
            "spec": yaml.safe_load(EXAMPLE.read_text())["spec"], "status": {}}


def applied(job: dict[str, Any], action: rec.Action) -> dict[str, Any]:
    """The job once the API server merged the status patch and checked it against the
    CRD's schema (grpo_testbed.status_patch)."""
    out = copy.deepcopy(job)
    out["status"] = apply_status_patch(out["status"], action.status)
    return out


def step(job: dict[str, Any], event: Any,
         observed: Observed | None = None) -> tuple[dict[str, Any], rec.Action]:
    action = rec.reconcile(job, observed or Observed(), event, T0, CONFIG)
    return applied(job, action), action


def hub_job(path: str = REPO, **hub: Any) -> dict[str, Any]:
    job = new_job()
    job["spec"]["model"] = {"path": path}
    job["spec"]["hub"] = {"endpoint": "acme", **hub}
    return job


def claim_job(path: str = "/models/acme-sft") -> dict[str, Any]:
    job = new_job()
    job["spec"]["model"] = {"path": path, "claimName": "models"}
    return job


MODEL_CLAIM = {"metadata": {"name": "models"}, "spec": {"accessModes": ["ReadOnlyMany"]}}


def conditions(job: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in job["status"]["conditions"]}


def test_a_hub_model_no_table_knows_is_planned_from_its_config_json(
        vl3b: dict[str, Any]) -> None:
    job, action = step(hub_job(), rec.SpecChanged(),
                       observed=Observed(hub=HubAnswer(URL, config=vl3b)))
    st = job["status"]
    assert st["modelConfig"] == {"source": "hub", "location": URL, "architecture": "qwen2_5_vl",
                                 "config": vl3b, "readAt": T0}
    assert st["plan"]["modelSource"] == f"hub config.json ({URL})"
    assert {c["kind"] for c in action.children} >= {"RayCluster", "ConfigMap"}
    planned = next(m for t, r, m in action.events if r == "Planned")
    assert planned.endswith(f"model shape from hub config.json ({URL})")
    model = next(d for d in st["plan"]["details"]["decisions"] if d.startswith("model="))
    assert model.startswith(f"model={shape_from_config(vl3b).parameters / 1e9:.2f}B")

    # The next attempt plans from status: no hub needed (Observed carries none).
    outcome = PodOutcome(FailureReason.CUDA_OOM, 3, "CUDA out of memory", step=3)
    stored = read_status(job["status"])
    ended = finish_attempt(stored.status, outcome, T0, Planner(job["spec"]))
    job = applied(job, ended.derive(stored, 1, T0))
    job["status"]["nextAttempt"]["notBefore"] = T0
    job, _ = step(job, rec.BackoffTimer())
    assert job["status"]["attempt"] == 1
    assert job["status"]["plan"]["modelSource"] == f"hub config.json ({URL})"


def test_an_unreachable_hub_says_so_and_retries_and_never_guesses() -> None:
    error = f"GET {URL}: [Errno 111] Connection refused"
    job, action = step(hub_job(), rec.SpecChanged(),
                       observed=Observed(hub=HubAnswer(URL, error=error, retry=True)))
    st = job["status"]
    assert st["phase"] == "Pending" and "modelConfig" not in st and "plan" not in st
    degraded = conditions(job)["Degraded"]
    assert degraded["status"] == "True" and degraded["reason"] == "ModelConfigUnavailable"
    assert error in degraded["message"]
    assert "spec.model.shape" in degraded["message"] and "reachable" in degraded["message"]
    assert action.events == [("Warning", "ModelConfigUnavailable", degraded["message"])]
    assert action.retry is not None and action.retry[1] == RETRY_SECONDS
    assert action.children == []


def test_a_model_the_table_knows_is_planned_from_the_table_and_the_plan_says_why() -> None:
    error = f"GET {hub_config_url(HUB, 'Qwen/Qwen2.5-VL-7B-Instruct', None)}: timed out"
    job, action = step(hub_job("Qwen/Qwen2.5-VL-7B-Instruct"), rec.SpecChanged(),
                       observed=Observed(hub=HubAnswer(URL, error=error, retry=True)))
    st = job["status"]
    assert st["modelConfig"]["source"] == "table" and error in st["modelConfig"]["message"]
    assert st["plan"]["modelSource"].startswith("known table: qwen2.5-vl-7b (")
    assert error in st["plan"]["modelSource"]
    (warning,) = [(t, m) for t, r, m in action.events if r == "ModelConfigUnavailable"]
    assert warning[0] == "Warning" and "from the known table (qwen2.5-vl-7b)" in warning[1]


def test_a_repo_the_hub_does_not_have_fails_naming_it() -> None:
    error = f"GET {URL}: HTTP 404 Not Found: check spec.model.path and spec.model.revision"
    job, action = step(hub_job(), rec.SpecChanged(),
                       observed=Observed(hub=HubAnswer(URL, error=error)))
    assert job["status"]["phase"] == "Failed" and action.retry is None
    failed = conditions(job)["Failed"]
    assert failed["reason"] == "ConfigError" and f"cannot read {URL}" in failed["message"]
    assert "HTTP 404" in failed["message"]


def test_an_architecture_the_trainer_does_not_train_fails_naming_it(tmp_path: Path) -> None:
    llama = shape_fields(json.loads(write_config(tmp_path, "llama").read_text()))
    job, _ = step(hub_job(), rec.SpecChanged(), observed=Observed(hub=HubAnswer(URL, llama)))
    assert job["status"]["modelConfig"]["architecture"] == "llama"
    failed = conditions(job)["Failed"]
    assert failed["reason"] == "InvalidSpec"
    assert "spec.model.path: config.json says model_type 'llama'" in failed["message"]
    assert "Qwen2.5-VL (qwen2_5_vl)" in failed["message"]


def reader_pod(action: rec.Action) -> dict[str, Any]:
    (pod,) = [c for c in action.children if c["kind"] == "Pod"]
    return pod


def ended(pod: dict[str, Any], code: int, message: str) -> dict[str, Any]:
    return {**pod, "status": {"phase": "Succeeded" if code == 0 else "Failed",
                              "containerStatuses": [{"name": "read", "state": {"terminated": {
                                  "exitCode": code, "reason": "Completed" if code == 0
                                  else "Error", "message": message}}}]}}


def test_a_model_on_a_claim_is_read_by_a_pod_then_planned(vl3b: dict[str, Any]) -> None:
    observed = Observed(model_claim=MODEL_CLAIM)
    job, action = step(claim_job(), rec.SpecChanged(), observed=observed)
    pod = reader_pod(action)
    assert action.children == [pod] and action.retry is not None
    assert action.retry[1] == READ_POLL_SECONDS
    assert job["status"]["phase"] == "Pending"
    assert conditions(job)["Progressing"]["reason"] == "ReadingModelConfig"
    (c,) = pod["spec"]["containers"]
    assert c["command"] == ["python", "-m", "grpo_api.model_config", "--path",
                            "/models/acme-sft"]
    assert c["image"] == CONFIG.default_image
    assert c["volumeMounts"] == [{"name": "models", "mountPath": "/models", "readOnly": True}]
    assert pod["spec"]["volumes"] == [{"name": "models", "persistentVolumeClaim": {
        "claimName": "models", "readOnly": True}}]
    assert pod["metadata"]["name"] == POD
    assert pod["metadata"]["ownerReferences"][0]["uid"] == "u1"
    assert pod_violations(pod["spec"], "restricted") == []

    running = {**pod, "status": {"phase": "Pending", "containerStatuses": [{"name": "read",
               "state": {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}}]}}
    job, action = step(job, rec.SpecChanged(), observed=Observed(model_claim=MODEL_CLAIM,
                                                                 model_reader=running))
    assert action.children == [] and "ImagePullBackOff: no such image" in conditions(job)[
        "Progressing"]["message"]

    done = ended(pod, 0, ReaderReport(config=vl3b).to_message())
    job, action = step(job, rec.SpecChanged(), observed=Observed(model_claim=MODEL_CLAIM,
                                                                 model_reader=done))
    where = "claim models:/models/acme-sft/config.json"
    assert job["status"]["modelConfig"]["source"] == "claim"
    assert job["status"]["modelConfig"]["location"] == where
    assert job["status"]["plan"]["modelSource"] == f"claim config.json ({where})"
    assert action.delete_pod == POD
    assert any(c["kind"] == "RayCluster" for c in action.children)


def test_a_claim_without_config_json_fails_naming_the_path() -> None:
    job, action = step(claim_job(), rec.SpecChanged(), observed=Observed(model_claim=MODEL_CLAIM))
    error = ("/models/acme-sft/config.json does not exist (/models/acme-sft holds: "
             "model.safetensors)")
    done = ended(reader_pod(action), 2, ReaderReport(error=error).to_message())
    job, action = step(job, rec.SpecChanged(), observed=Observed(model_claim=MODEL_CLAIM,
                                                                 model_reader=done))
    failed = conditions(job)["Failed"]
    assert failed["reason"] == "ConfigError" and action.retry is None
    assert failed["message"].startswith(
        f"spec.model.path: cannot read claim models:/models/acme-sft/config.json: {error}")
    assert action.delete_pod == POD


def test_a_reader_pod_without_a_report_fails_saying_why() -> None:
    job, action = step(claim_job(), rec.SpecChanged(), observed=Observed(model_claim=MODEL_CLAIM))
    done = ended(reader_pod(action), 1, "No module named grpo_api.model_config")
    job, _ = step(job, rec.SpecChanged(), observed=Observed(model_claim=MODEL_CLAIM,
                                                            model_reader=done))
    message = conditions(job)["Failed"]["message"]
    assert "without a report: No module named grpo_api.model_config" in message
    assert "set spec.image" in message


def test_a_private_repo_is_read_by_a_pod_with_the_jobs_token() -> None:
    job, action = step(hub_job(tokenSecret="hf", tokenKey="tok"), rec.SpecChanged())
    (c,) = reader_pod(action)["spec"]["containers"]
    assert c["command"][-2:] == ["--url", URL]
    assert c["env"][0] == {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {
        "name": "hf", "key": "tok"}}}
    assert "volumeMounts" not in c
    unreachable = ended(reader_pod(action), 1,
                        ReaderReport(error=f"GET {URL}: timed out", retry=True).to_message())
    job, action = step(job, rec.SpecChanged(), observed=Observed(model_reader=unreachable))
    assert conditions(job)["Degraded"]["reason"] == "ModelConfigUnavailable"
    assert action.delete_pod == POD and action.retry is not None  # a new pod next time


def test_a_job_planned_before_is_never_read_again() -> None:
    job, _ = step(hub_job(), rec.SpecChanged(), observed=Observed(
        hub=HubAnswer(URL, error="down", retry=True)))
    job["status"]["attempts"] = [{"index": 0, "outcome": "Running"}]
    assert rec.to_read(job["spec"], read_status(job["status"]).status) is None


def test_admission_plans_a_public_hub_model_from_its_config(
        vl3b: dict[str, Any], tmp_path: Path) -> None:
    spec = hub_job()["spec"]
    assert admission_problem(spec, None, hub_endpoints=HUBS,
                             hub=HubAnswer(URL, config=vl3b)) is None
    spec["resources"] = {"gpuType": "A100-40GB", "nodes": 1, "gpusPerNode": 1}
    spec["memory"] = {"offloadParams": False, "offloadOptimizer": False}
    refused = admission_problem(spec, None, hub_endpoints=HUBS,
                                hub=HubAnswer(URL, config=vl3b))
    assert refused is not None and refused.startswith("the memory planner refuses this job")
    llama = shape_fields(json.loads(write_config(tmp_path, "llama").read_text()))
    refused = admission_problem(hub_job()["spec"], None, hub_endpoints=HUBS,
                                hub=HubAnswer(URL, config=llama))
    assert refused is not None and "config.json says model_type 'llama'" in refused


def test_admission_refuses_a_repo_the_hub_does_not_have_and_admits_one_it_cannot_reach(
) -> None:
    spec = hub_job()["spec"]
    gone = HubAnswer(URL, error=f"GET {URL}: HTTP 404 Not Found")
    refused = admission_problem(spec, None, hub_endpoints=HUBS, hub=gone)
    assert refused is not None and "HTTP 404" in refused and "spec.model.shape" in refused
    down = HubAnswer(URL, error=f"GET {URL}: timed out", retry=True)
    assert admission_problem(spec, None, hub_endpoints=HUBS, hub=down) is None
    (warning,) = admission_warnings(spec, down)
    assert "timed out" in warning and "ModelConfigUnavailable" in warning


def test_admission_admits_a_claim_model_and_says_it_is_planned_once_read() -> None:
    spec = claim_job()["spec"]
    assert admission_problem(spec, None) is None
    (warning,) = admission_warnings(spec)
    assert "claim models:/models/acme-sft/config.json is read by a pod" in warning
    spec["resources"]["gpusPerNode"] = 0  # still checked: the spec itself
    assert "gpusPerNode" in str(admission_problem(spec, None))


def test_the_reader_pod_is_scheduled_as_the_head_is() -> None:
    job = claim_job()
    job["spec"]["pods"] = {"head": {"nodeSelector": {"pool": "cpu"},
                                    "imagePullSecrets": [{"name": "reg"}]},
                           "common": {"env": [{"name": "HTTPS_PROXY", "value": "http://p"}]}}
    _, action = step(job, rec.SpecChanged(), observed=Observed(model_claim=MODEL_CLAIM))
    spec = reader_pod(action)["spec"]
    assert spec["nodeSelector"] == {"pool": "cpu"}
    assert spec["imagePullSecrets"] == [{"name": "reg"}]
    assert spec["containers"][0]["env"] == [{"name": "HTTPS_PROXY", "value": "http://p"}]
    assert yaml.safe_dump(spec)  # plain data


def test_without_public_hub_reads_only_a_named_endpoint_is_read() -> None:
    """--no-read-public-hub (the chart's readPublicHub: false): the operator GETs the
    config.json of a job that names spec.hub.endpoint, never the public hub's."""
    public = new_job()
    public["spec"]["model"] = {"path": REPO}
    assert rec.operator_reads_hub(public["spec"], NEW, read_public_hub=True)
    assert not rec.operator_reads_hub(public["spec"], NEW, read_public_hub=False)
    assert rec.operator_reads_hub(hub_job()["spec"], NEW, read_public_hub=False)


def test_without_public_hub_reads_a_model_no_table_knows_is_refused_saying_why() -> None:
    public = new_job()
    public["spec"]["model"] = {"path": REPO}
    problem = admission_problem(public["spec"], None, hub_endpoints=HUBS, hub=None)
    assert problem is not None
    assert "does not read the public hub (--no-read-public-hub" in problem, problem
    assert "set spec.model.shape" in problem, problem
    known = new_job()  # the example's Qwen2.5-VL-7B: the table, saying why
    assert admission_problem(known["spec"], None, hub_endpoints=HUBS, hub=None) is None
    job, _ = step(known, rec.SpecChanged())
    assert job["status"]["plan"]["modelSource"] == \
        "known table: qwen2.5-vl-7b (no config.json read)"
