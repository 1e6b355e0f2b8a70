"""A model on a claim is sized from its own config.json, read inside the cluster: on the
testbed's real node a pod of the product's trainer image mounts the claim read-only and
reports the shape fields, and the operator (in the cluster, as the chart deploys it)
plans the job from them. The model is a tiny config.json written by transformers under a name no
table knows; a directory without one fails the job naming the path."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from grpo_operator.planner import shape_from_config
from grpo_testbed.images import TRAINER_CPU
from grpo_testbed.processes import wait_until
from grpo_testbed.tiny_job import JOB_NS, TinyJob, example, tiny_job_testbed
from grpo_testkit.tiny_configs import write_config

pytestmark = pytest.mark.e2e

CLAIM = example()["spec"]["model"]["claimName"]
JOBS = {"sized": "/models/acme-sft", "missing": "/models/no-config"}
READERS = {f"{name}-model-config" for name in JOBS}


def job_status(tj: TinyJob, name: str) -> dict[str, Any]:
    out = tj.tb.kubectl("get", "grpojob", name, "-n", JOB_NS, "-o", "json").stdout
    return dict(json.loads(out).get("status") or {})


def wait_status(tj: TinyJob, name: str, what: str,
                ok: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    try:
        wait_until(f"{name}: {what}", lambda: ok(job_status(tj, name)), 240,
                   interval_s=1.0)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {job_status(tj, name)}\n"
                             f"operator log:\n{tj.operator_log()}") from None
    return job_status(tj, name)


@pytest.fixture(scope="module")
def tj(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyJob]:
    """Both jobs applied at once (their reader pods are small; the sized job's Ray head
    comes only after its read)."""
    work = tmp_path_factory.mktemp("model-config")
    with tiny_job_testbed(work) as tj:
        tb = tj.tb
        try:
            tj.install_chart()
            tb.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                      "metadata": {"name": CLAIM, "namespace": JOB_NS},
                      "spec": {"accessModes": ["ReadOnlyMany"],
                               "resources": {"requests": {"storage": "1Gi"}}}})
            root = tj.claim_dir(CLAIM)
            write_config(root / "acme-sft", "qwen2_5_vl")
            (root / "no-config").mkdir(exist_ok=True)
            (root / "no-config" / "model.safetensors").write_bytes(b"")
            for path in [root, *root.rglob("*")]:  # the pods run as 10001
                path.chmod(0o755 if path.is_dir() else 0o644)
            for name, model_path in JOBS.items():
                doc = example()
                doc["metadata"]["name"] = name
                doc["spec"]["model"]["path"] = model_path
                del doc["spec"]["model"]["shape"]  # only its config.json can size it
                manifest = work / f"{name}.yaml"
                manifest.write_text(yaml.safe_dump(doc))
                tb.kubectl("apply", "-n", JOB_NS, "-f", str(manifest))
            yield tj
        finally:
            for name in JOBS:
                tb.kubectl("delete", "grpojob", name, "-n", JOB_NS, "--ignore-not-found",
                           "--wait=true", "--timeout=60s", check=False)


def test_a_claim_model_is_planned_from_its_config_json_read_by_a_pod(
        tj: TinyJob) -> None:
    st = wait_status(tj, "sized", "planned", lambda s: "plan" in s)
    where = f"claim {CLAIM}:/models/acme-sft/config.json"
    assert st["modelConfig"]["source"] == "claim", st
    assert st["modelConfig"]["location"] == where
    assert st["modelConfig"]["architecture"] == "qwen2_5_vl"
    assert st["plan"]["modelSource"] == f"claim config.json ({where})"
    written = json.loads((tj.claim_dir(CLAIM) / "acme-sft" / "config.json").read_text())
    ours = shape_from_config(st["modelConfig"]["config"])
    assert ours == shape_from_config(written)
    model = next(d for d in st["plan"]["details"]["decisions"] if d.startswith("model="))
    assert f"{ours.layers} layers, hidden {ours.hidden_size}" in model


def test_a_directory_without_config_json_fails_naming_the_path(tj: TinyJob) -> None:
    st = wait_status(tj, "missing", "Failed", lambda s: s.get("phase") == "Failed")
    failed = next(c for c in st["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "ConfigError", st
    assert failed["message"].startswith(
        f"spec.model.path: cannot read claim {CLAIM}:/models/no-config/config.json: "
        "/models/no-config/config.json does not exist (/models/no-config holds: "
        "model.safetensors)"), failed["message"]
    assert "plan" not in st


def test_the_readers_ran_from_the_trainer_image_and_are_deleted_once_read(
        tj: TinyJob) -> None:
    for name in JOBS:  # both read (the tests above may run alone)
        wait_status(tj, name, "read", lambda s: "plan" in s or s.get("phase") == "Failed")

    def readers_left() -> set[str]:
        pods = tj.tb.kubectl("get", "pods", "-n", JOB_NS, "-o", "name").stdout.split()
        return {p.removeprefix("pod/") for p in pods} & READERS

    wait_until("the reader pods deleted", lambda: not readers_left(), 60, interval_s=1.0)
    events = json.loads(tj.tb.kubectl("get", "events", "-n", JOB_NS, "-o", "json").stdout)
    pulled = {e["involvedObject"]["name"]: e.get("message", "") for e in events["items"]
              if e["involvedObject"].get("name") in READERS and e["reason"] == "Pulled"}
    assert set(pulled) == READERS, pulled
    assert all(TRAINER_CPU.tag in m for m in pulled.values()), pulled
