"""The main job with its checkpoints in an S3 store (spec.checkpoint.store) and no claim,
end to end on the real node: the testbed's S3 server (versitygw), the keys in a Secret
the user made, the worker pod OOM-killed as in test_tiny_job, attempt 1 resuming from
what the store holds (its pods' disks are new and empty: nothing else could serve it),
the export landing in the store where status.export.uri says, attempt 0's logs and events
read back from the store where status.attempts[0].logs says, and the keys in no object,
event or log a user can read. Its train split is an object in the store too
(spec.data.train: s3://...), and so is the model (spec.model.path: s3://.../): its
config.json read for the plan by the reader pod, the model and the split fetched onto
each pod before its ranks start.

One scenario (module fixture).
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grpo_api.contract import ATTEMPT_EVENTS, STORE_KEY_ENV
from grpo_testbed.tiny_job import (
    JOB,
    JOB_NS,
    TERMINAL,
    TinyJob,
    multipod_example,
    tiny_job_testbed,
    worker_oom,
)
from grpo_trainer.checkpointing.tracker import EXPORT_MARKER, MANIFEST, TRACKER

pytestmark = pytest.mark.e2e

BUCKET = "ckpt"
PREFIX = "grpo"
SECRET = "s3-keys"
DATA_KEY = "datasets/tiny/train.parquet"
MODEL_PREFIX = "models/tiny-qwen2.5-vl"
RESUMED = re.compile(r"resumed from checkpoint step (\d+)")
TOTAL = int(multipod_example()["spec"]["training"]["maxSteps"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyJob]:
    with tiny_job_testbed(tmp_path_factory.mktemp("e2e-store"), worker_oom()) as tj:
        s3 = tj.tb.s3
        assert s3 is not None, "the testbed runs no S3 server"
        s3.make_bucket(BUCKET)
        tj.install_chart()
        tj.build_assets()
        # As a user makes it: the keys in a Secret of the job's namespace.
        keys = dict(zip(STORE_KEY_ENV, (s3.access_key, s3.secret_key), strict=True))
        tj.tb.kubectl("create", "secret", "generic", SECRET, "-n", JOB_NS,
                      *(f"--from-literal={k}={v}" for k, v in keys.items()))
        doc = multipod_example()
        for key in ("claimName", "size", "storageClass"):  # no claim at all
            doc["spec"]["checkpoint"].pop(key, None)
        # The train split as an object in the store (the parquet holds its images).
        data = s3.root / BUCKET / DATA_KEY
        data.parent.mkdir(parents=True, exist_ok=True)
        data.write_bytes(tj.data_file().read_bytes())
        doc["spec"]["data"]["train"] = f"s3://{BUCKET}/{DATA_KEY}"
        # And the model: its Hugging Face directory under a prefix (no model claim).
        model = s3.root / BUCKET / MODEL_PREFIX
        shutil.copytree(tj.model_dir(), model)
        doc["spec"]["model"] = {"path": f"s3://{BUCKET}/{MODEL_PREFIX}/"}
        doc["spec"]["checkpoint"]["store"] = {
            "uri": f"s3://{BUCKET}/{PREFIX}", "endpoint": s3.endpoint, "region": "us-east-1",
            "pathStyle": True, "keysSecret": SECRET}
        tj.apply_job(doc)
        tj.watch(lambda j: j.get("status", {}).get("phase") in TERMINAL, 1500,
                 "the tiny job with its checkpoints in the store to finish")
        yield tj


def stored(tj: TinyJob) -> Path:
    """The job's prefix in the store, as the S3 server's POSIX backend keeps it."""
    assert tj.tb.s3 is not None
    return tj.tb.s3.root / BUCKET / PREFIX / JOB_NS / JOB


def status(tj: TinyJob) -> dict[str, Any]:
    return dict(tj.job()["status"])


def test_attempt_1_resumed_from_the_store_after_the_oom_kill(tiny: TinyJob) -> None:
    st = status(tiny)
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    first, second = st["attempts"]
    assert first["outcome"] == "HostOOM" and second["outcome"] == "Succeeded", st["attempts"]
    found = RESUMED.search(tiny.head_log(1))
    assert found, "attempt 1 did not resume from a checkpoint"
    assert int(found.group(1)) == first["lastCheckpointStep"] > 0, (found[0], first)
    # The newest checkpoint is complete in the store (the one attempt 1 resumed from is
    # gone by now: keep 2): its manifest names every file with its size, each there.
    step = stored(tiny) / f"step-{TOTAL}"
    manifest = json.loads((step / MANIFEST).read_text())
    files = manifest["files"]
    assert any(name.endswith(".distcp") for name in files), sorted(files)
    for name, entry in files.items():
        assert (step / name).stat().st_size == entry["size"], name
    assert json.loads((stored(tiny) / TRACKER).read_text())["step"] == TOTAL


def test_no_claim_was_made_each_pod_staged_on_its_own_disk(tiny: TinyJob) -> None:
    claims = json.loads(tiny.tb.kubectl("get", "pvc", "-n", JOB_NS, "-o", "json").stdout)
    assert not [c["metadata"]["name"] for c in claims["items"]
                if c["metadata"]["name"].startswith(JOB) and "checkpoints" in
                c["metadata"]["name"]], claims["items"]
    for attempt in (0, 1):
        pods = tiny.pods(attempt)
        assert len(pods) == 2, [p["metadata"]["name"] for p in pods]
        for pod in pods:
            (vol,) = [v for v in pod["spec"]["volumes"] if v["name"] == "checkpoints"]
            assert vol.get("emptyDir") == {}, vol


def kept_in_store(tj: TinyJob, attempt: int) -> dict[str, str]:
    """What status.attempts[attempt].logs names in the store, read back file by file."""
    record = next(a for a in tj.job()["status"]["attempts"] if a["index"] == attempt)
    prefix = f"s3://{BUCKET}/"
    assert record["logs"] == f"{prefix}{PREFIX}/{JOB_NS}/{JOB}/attempts/{attempt}", record
    assert tj.tb.s3 is not None
    where = tj.tb.s3.root / BUCKET / record["logs"].removeprefix(prefix)
    return {str(f.relative_to(where)): f.read_text(errors="replace")
            for f in sorted(where.rglob("*")) if f.is_file()}


def test_attempt_0s_logs_and_events_are_read_back_from_the_store(tiny: TinyJob) -> None:
    """The head pod of attempt 0 is gone with its disk; what it printed (its ranks' lines
    too, sent by Ray) is in the store, as the node's own log archive has it, and so are
    attempt 0's events (kept by attempt 1's driver)."""
    kept = kept_in_store(tiny, 0)
    head = [k for k in kept if k.startswith(f"{tiny.name}-a0-head")]
    assert len(head) == 1, sorted(kept)
    archived = step_metrics(tiny.head_log(0))
    assert archived and [m["step"] for m in step_metrics(kept[head[0]])] == [
        m["step"] for m in archived]
    assert "training failed" in kept[head[0]] or "ranks" in kept[head[0]]
    assert ATTEMPT_EVENTS in kept and f"Pod/{tiny.name}-a0-" in kept[ATTEMPT_EVENTS]


def step_metrics(log: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.splitlines()
            if line.startswith("{") and '"step"' in line]


def test_the_export_is_in_the_store_where_status_says(tiny: TinyJob) -> None:
    export = status(tiny)["export"]
    assert export == {"uri": f"s3://{BUCKET}/{PREFIX}/{JOB_NS}/{JOB}/export", "step": TOTAL}
    out = stored(tiny) / "export"
    assert json.loads((out / EXPORT_MARKER).read_text())["step"] == TOTAL
    assert (out / "config.json").is_file() and (out / "model.safetensors").stat().st_size > 0


def test_the_keys_are_in_no_object_event_or_log_a_user_reads(tiny: TinyJob) -> None:
    s3 = tiny.tb.s3
    assert s3 is not None
    kubectl = tiny.tb.kubectl
    readable = [
        kubectl("get", "grpojob", JOB, "-n", JOB_NS, "-o", "yaml").stdout,
        kubectl("get", "configmaps,events,rayclusters,pods", "-n", JOB_NS,
                "-o", "yaml").stdout,
        tiny.operator_log(tail=-1), tiny.head_log(0), tiny.head_log(1),
        tiny.worker_log(0), tiny.worker_log(1), *kept_in_store(tiny, 0).values(),
    ]
    assert all(readable), "a source to search was empty"
    for key in (s3.access_key, s3.secret_key):
        assert not [i for i, text in enumerate(readable) if key in text]
    # Every Ray pod got them by reference to the Secret (its ranks upload).
    pods = tiny.pods(1)
    assert len(pods) == 2
    for pod in pods:
        env = pod["spec"]["containers"][0]["env"]
        refs = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in env
                if e["name"] in STORE_KEY_ENV}
        assert refs == dict.fromkeys(STORE_KEY_ENV, SECRET), pod["metadata"]["name"]


def test_each_pod_fetched_the_train_split_from_the_store_before_its_ranks(
        tiny: TinyJob) -> None:
    """No claim: every Ray pod's hub-fetch step fetched the object onto its own disk, and
    the fetch said so in the HubFetch condition."""
    for attempt in (0, 1):
        for pod in tiny.pods(attempt):
            (init,) = [c for c in pod["spec"]["initContainers"] if c["name"] == "hub-fetch"]
            assert f"s3://{BUCKET}/{DATA_KEY}" in init["command"]
            (ended,) = [s["state"]["terminated"] for s in
                        pod["status"].get("initContainerStatuses") or []
                        if s["name"] == "hub-fetch"]
            assert ended["exitCode"] == 0, (pod["metadata"]["name"], ended)
    (fetched,) = [c for c in status(tiny)["conditions"] if c["type"] == "HubFetch"]
    assert (fetched["status"], fetched["reason"]) == ("True", "Fetched"), fetched
    assert f"s3://{BUCKET}/{DATA_KEY}" in fetched["message"]


def test_the_plan_was_made_from_the_models_config_json_in_the_store(tiny: TinyJob) -> None:
    read = status(tiny)["modelConfig"]
    assert (read["source"], read["location"]) == (
        "store", f"s3://{BUCKET}/{MODEL_PREFIX}/config.json"), read
    on_claim = json.loads((tiny.model_dir() / "config.json").read_text())
    assert read["architecture"] == on_claim["model_type"]
    assert status(tiny)["plan"]["modelSource"].startswith("store config.json"), status(tiny)["plan"]
