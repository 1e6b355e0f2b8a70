"""The main job with its checkpoints in an S3 store (spec.checkpoint.store), end to end on
the real node: the testbed's S3 server (versitygw), the keys in a Secret the user made,
the worker pod OOM-killed as in test_tiny_job, attempt 1 resuming from what the store
holds (each save's staged files are dropped once uploaded, so nothing else could serve
it), the export landing in the store where status.export.uri says, and the keys in no
object, event or log a user can read.

One scenario (module fixture). The claim still holds the attempts' logs and the data
index (docs/configuration.md, "Object storage").
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grpo_api.contract import STORE_KEY_ENV
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
    # The checkpoint it resumed from is complete in the store: its manifest names every
    # file with its size, and each is there at that size.
    step = stored(tiny) / f"step-{first['lastCheckpointStep']}"
    manifest = json.loads((step / MANIFEST).read_text())
    files = manifest["files"]
    assert any(name.endswith(".distcp") for name in files), sorted(files)
    for name, entry in files.items():
        assert (step / name).stat().st_size == entry["size"], name
    assert json.loads((stored(tiny) / TRACKER).read_text())["step"] == TOTAL


def test_the_claim_kept_no_checkpoint_shards_only_the_store_has_them(tiny: TinyJob) -> None:
    """Each rank drops its staged files once they are uploaded: the claim ends with no
    shard of any step, so attempt 1's ranks can only have loaded theirs from the store;
    the claim still has what it is for (the attempts' logs)."""
    on_claim = tiny.checkpoint_dir()
    shards = sorted(str(p.relative_to(on_claim)) for p in on_claim.rglob("*.distcp"))
    assert not shards, shards
    assert tiny.kept_logs(0), "attempt 0's logs are not on the claim"


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
        tiny.worker_log(0), tiny.worker_log(1), *tiny.kept_logs(0).values(),
    ]
    assert all(readable), "a source to search was empty"
    for key in (s3.access_key, s3.secret_key):
        assert not [i for i, text in enumerate(readable) if key in text]
    # The pods got them by reference to the Secret.
    cluster = json.loads(kubectl("get", "raycluster", f"{JOB}-a1", "-n", JOB_NS,
                                 "-o", "json").stdout)
    env = cluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in env
            if e["name"] in STORE_KEY_ENV}
    assert refs == dict.fromkeys(STORE_KEY_ENV, SECRET)
