"""On a real API server with the operator's webhook: a hub model under a name no table
knows is sized from the hub's config.json, at apply and in the job's plan; an
architecture the trainer does not train is refused at apply, naming it; a hub that
cannot be reached is said, on the job, with the error and the fix. The hub is a
STAND-IN (grpo_testkit.hub: the hub's file API over a hub-layout directory on
loopback, which the operator process reaches); the config.json files are written by
transformers."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

import pytest
import yaml

from grpo_api.model_config import hub_config_url
from grpo_operator.planner import shape_from_config
from grpo_testbed.chart import one, render
from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed
from grpo_testbed.operator_process import OperatorProcess
from grpo_testbed.processes import wait_until
from grpo_testkit.hub import StandInHub, stand_in_hub
from grpo_testkit.tiny_configs import write_config, write_qwen25_vl_3b

REPO = "acme/custom-vl-3b"  # in no table: only its config.json can size it


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandInHub]:
    root = tmp_path_factory.mktemp("hub")
    write_qwen25_vl_3b(root / "models" / REPO)
    write_config(root / "models" / "acme" / "llama-sft", "llama")
    with stand_in_hub(root) as h:
        yield h


@pytest.fixture(scope="module")
def offline() -> str:
    """A hub URL nothing answers at: a port nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def operator(start_operator: Callable[..., AbstractContextManager[OperatorProcess]],
             hub: StandInHub, offline: str, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[OperatorProcess]:
    """The operator with the hubs the chart's hubEndpoints lists, passed as the chart's
    Deployment passes them: jobs name "standin" and "offline"."""
    dep = one(render({"hubEndpoints.standin": hub.url, "hubEndpoints.offline": offline}),
              "Deployment")
    (listed,) = [a for a in dep["spec"]["template"]["spec"]["containers"][0]["args"]
                 if a.startswith("--hub-endpoints=")]
    with start_operator(tmp_path_factory.mktemp("operator"), listed) as op:
        yield op


def hub_job(name: str, repo: str, endpoint: str) -> dict[str, Any]:
    return example_job("grpojob-qwen25vl-7b-h100.yaml", name, model={"path": repo},
                       hub={"endpoint": endpoint})


def apply(tb: Testbed, ns: str, doc: dict[str, Any]) -> Any:
    return tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=False)


def status(tb: Testbed, ns: str, name: str) -> dict[str, Any]:
    out = tb.kubectl("get", "grpojob", name, "-n", ns, "-o", "json").stdout
    return dict(json.loads(out).get("status") or {})


def wait_status(tb: Testbed, op: OperatorProcess, ns: str, name: str, what: str,
                ok: Any, timeout_s: float = 90) -> dict[str, Any]:
    try:
        wait_until(f"{name}: {what}", lambda: ok(status(tb, ns, name)), timeout_s,
                   interval_s=1.0)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {status(tb, ns, name)}\n"
                             f"operator log:\n{op.log_tail()}") from None
    return status(tb, ns, name)


def test_a_hub_model_no_table_knows_is_planned_from_its_config_json(
        testbed: Testbed, operator: OperatorProcess, op_ns: str, hub: StandInHub) -> None:
    res = apply(testbed, op_ns, hub_job("custom", REPO, "standin"))
    assert res.returncode == 0, res.stderr
    url = hub_config_url(hub.url, REPO, None)
    st = wait_status(testbed, operator, op_ns, "custom", "planned",
                     lambda s: bool(s.get("plan")))
    assert st["plan"]["modelSource"] == f"hub config.json ({url})"
    assert st["modelConfig"]["source"] == "hub" and st["modelConfig"]["location"] == url
    assert st["modelConfig"]["architecture"] == "qwen2_5_vl"
    billions = shape_from_config(st["modelConfig"]["config"]).parameters / 1e9
    model = next(d for d in st["plan"]["details"]["decisions"] if d.startswith("model="))
    assert model.startswith(f"model={billions:.2f}B") and round(billions, 2) == 3.75
    # Read at apply and reused by the plan: the hub saw one GET of it.
    assert hub.requests.count(f"GET /{REPO}/resolve/main/config.json") == 1


def test_an_architecture_the_trainer_does_not_train_is_refused_at_apply(
        testbed: Testbed, operator: OperatorProcess, op_ns: str, hub: StandInHub) -> None:
    res = apply(testbed, op_ns, hub_job("llama", "acme/llama-sft", "standin"))
    assert res.returncode != 0
    assert "spec.model.path: config.json says model_type 'llama'" in res.stderr
    assert "LlamaForCausalLM" in res.stderr and "Qwen2.5-VL (qwen2_5_vl)" in res.stderr


def test_a_hub_the_platform_does_not_list_is_refused_at_apply_and_never_read(
        testbed: Testbed, operator: OperatorProcess, op_ns: str, hub: StandInHub) -> None:
    before = len(hub.requests)
    res = apply(testbed, op_ns, hub_job("elsewhere", REPO, f"{hub.url}/other"))
    assert res.returncode != 0
    assert f"spec.hub.endpoint: the URL '{hub.url}/other' is not one of the cluster's hub " \
        "endpoints (offline, standin)" in res.stderr, res.stderr
    assert "Fix: set spec.hub.endpoint to one of offline, standin" in res.stderr
    assert len(hub.requests) == before  # nothing was read from it


def test_an_unreachable_hub_is_said_on_the_job_with_the_fix(
        testbed: Testbed, operator: OperatorProcess, op_ns: str, offline: str) -> None:
    endpoint = offline
    res = apply(testbed, op_ns, hub_job("offline", REPO, "offline"))
    assert res.returncode == 0, res.stderr
    assert "Warning: spec.model: GET " in res.stderr and "ModelConfigUnavailable" in res.stderr
    st = wait_status(testbed, operator, op_ns, "offline", "ModelConfigUnavailable",
                     lambda s: any(c["reason"] == "ModelConfigUnavailable"
                                   for c in s.get("conditions") or []))
    degraded = next(c for c in st["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and st["phase"] == "Pending" and "plan" not in st
    assert hub_config_url(endpoint, REPO, None) in degraded["message"]
    assert "spec.model.shape" in degraded["message"]
    events = testbed.kubectl("get", "events", "-n", op_ns, "--field-selector",
                             "involvedObject.name=offline,reason=ModelConfigUnavailable",
                             "-o", "json").stdout
    assert json.loads(events)["items"], "no ModelConfigUnavailable event"


def test_a_claim_model_is_admitted_and_waits_for_its_reader_pod(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    """kwok runs the reader pod in name only (it never reports): the read itself is
    tests/e2e/test_model_config_claim.py's, on the real node."""
    doc = example_job("grpojob-tiny.yaml", "onclaim", kwok=False)
    del doc["spec"]["model"]["shape"]
    testbed.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                   "metadata": {"name": doc["spec"]["model"]["claimName"],
                                "namespace": op_ns},
                   "spec": {"accessModes": ["ReadOnlyMany"],
                            "resources": {"requests": {"storage": "1Gi"}}}})
    res = apply(testbed, op_ns, doc)
    assert res.returncode == 0 and "is read by a pod" in res.stderr, res.stderr
    st = wait_status(testbed, operator, op_ns, "onclaim", "ReadingModelConfig",
                     lambda s: any(c["reason"] == "ReadingModelConfig"
                                   for c in s.get("conditions") or []))
    assert st["phase"] == "Pending"
    pod = json.loads(testbed.kubectl("get", "pod", "onclaim-model-config", "-n", op_ns,
                                     "-o", "json").stdout)
    assert pod["metadata"]["ownerReferences"][0]["name"] == "onclaim"
