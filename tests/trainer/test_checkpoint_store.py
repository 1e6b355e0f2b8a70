"""s3:// checkpoints against a real S3 server (the testbed's versitygw), on real Ray with 2
FSDP ranks.

Each pod stages its files in a local ``checkpoint.dir`` and the store is the truth: a run
whose local directory is wiped (a new pod) resumes from the store alone and continues
exactly; a step cut off mid-upload (no manifest) is never loaded and is removed; the store
going away during an upload delays that checkpoint, not the training; refused keys stop
the run at once with a message naming the Secret, and nothing is lost.
"""

from __future__ import annotations

import io
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from grpo_api.trainer_config import Config, ObjectStoreConfig
from grpo_testbed.s3_server import REGION, S3Server, standalone_s3_server
from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_trainer.checkpointing.dcp import DCPCheckpointer
from grpo_trainer.checkpointing.final_export import FinalExport
from grpo_trainer.checkpointing.rank_store import RankUpload
from grpo_trainer.checkpointing.tracker import MANIFEST, Manifest, Tracker
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.driver.metrics import MetricsLogger
from grpo_trainer.object_store import ObjectStore, StoreRefused, UploadFailed

pytestmark = pytest.mark.trainer

VOLATILE = ("time/", "throughput/", "memory/")
BUCKET = "checkpoints"
SECRET = "s3-keys"  # the Secret a user would name in spec.checkpoint


@dataclass
class Store:
    server: S3Server
    bucket_dir: Path

    def cfg(self, prefix: str, **kw: Any) -> dict[str, Any]:
        return {"uri": f"s3://{BUCKET}/{prefix}", "endpoint": self.server.endpoint,
                "region": REGION, "path_style": True, "keys_secret": SECRET, **kw}

    def client(self, prefix: str) -> ObjectStore:
        return ObjectStore(ObjectStoreConfig(**self.cfg(prefix)))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory, local_ray_args: dict[str, Any]
          ) -> Iterator[Store]:
    """The S3 server, and the tier's local Ray started again with its keys in the
    environment, as a pod gets them from the Secret (the ranks read them there)."""
    import ray

    server = standalone_s3_server(tmp_path_factory.mktemp("s3"))
    server.make_bucket(BUCKET)
    was_running = ray.is_initialized()
    if was_running:
        ray.shutdown()
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("AWS_ACCESS_KEY_ID", server.access_key)
            env.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
            ray.init(**local_ray_args)
            try:
                yield Store(server, server.root / BUCKET)
            finally:
                ray.shutdown()
    finally:
        server.stop()
        if was_running:
            ray.init(**local_ray_args)


class _Lines(io.StringIO):
    """The metrics stream, calling ``on_step(step)`` as each step's line is printed."""

    def __init__(self, on_step: Any = None) -> None:
        super().__init__()
        self.on_step = on_step

    def write(self, s: str) -> int:
        n = super().write(s)
        if self.on_step is not None and s.strip().startswith("{"):
            self.on_step(json.loads(s)["step"])
        return n


def _train(cfg: Config, on_step: Any = None, exported: list[FinalExport] | None = None,
           uploads: dict[int, dict[str, object] | None] | None = None
           ) -> dict[int, dict[str, Any]]:
    """Train; ``uploads``: what the driver reports of the store's upload after each step
    (status.progress.checkpointUpload), and under -1 after the run."""
    checkpointer = DCPCheckpointer(cfg)

    def step_done(step: int) -> None:
        if uploads is not None:
            uploads[step] = checkpointer.upload_status()
        if on_step is not None:
            on_step(step)

    out = _Lines(step_done)
    trainer = GRPOTrainer(cfg, checkpointer=checkpointer,
                          metrics=MetricsLogger(cfg.metrics, cfg.trainer.total_steps or 0,
                                                stream=out))
    try:
        trainer.run()
        if exported is not None:  # as grpo-train does after a finished run
            done = trainer.export_final()
            assert done is not None
            exported.append(done)
    finally:
        trainer.close()
    if uploads is not None:
        uploads[-1] = checkpointer.upload_status()
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    return {m["step"]: {k: v for k, v in m.items() if not k.startswith(VOLATILE)}
            for m in lines}


def _config(tiny_lm: Path, data: Path, local: Path, store: Store, prefix: str,
            export: bool = False, **store_kw: Any) -> Config:
    raw = text_config(tiny_lm, data, trainer={"total_steps": 4},
                      checkpoint={"dir": str(local), "interval_steps": 2, "keep": 2,
                                  "export": export, "store": store.cfg(prefix, **store_kw)})
    return build_config(raw, environ={})


def _manifest(store: Store, prefix: str, step: int) -> Manifest:
    data = store.client(prefix).get_bytes(f"step-{step}/{MANIFEST}")
    assert data is not None, f"step-{step} has no manifest in the store"
    return Manifest.model_validate_json(data)


def test_a_new_pod_resumes_from_the_store_alone_and_continues_exactly(
        tiny_lm: Path, store: Store, tmp_path: Path) -> None:
    data = write_text_task(tmp_path / "t.jsonl")
    reference = _train(_config(tiny_lm, data, tmp_path / "pod-a", store, "exact"))
    objects = store.client("exact").sizes()
    # Retention kept the newest two; every file each manifest names is in the store.
    assert {n.split("/")[0] for n in objects if "/" in n} == {"step-2", "step-4"}
    for step in (2, 4):
        manifest = _manifest(store, "exact", step)
        for name, entry in manifest.files.items():
            assert objects[f"step-{step}/{name}"] == entry.size, name
    assert Tracker.model_validate_json(store.client("exact").get_bytes("latest") or b"").step == 4
    # The pod's disk holds no shard once it is up.
    assert not list((tmp_path / "pod-a").glob("step-*/*.distcp"))

    shards_at_4 = {k: v.digest for k, v in _manifest(store, "exact", 4).files.items()
                   if k.endswith(".distcp")}
    # A run that died during step 3: the store as it was after step 2's commit, and a
    # step-4 upload cut off before its manifest (a SIGKILL mid-upload leaves this).
    client = store.client("exact")
    client.delete([f"step-4/{MANIFEST}"])
    client.put_bytes("latest", Tracker(step=2, dir="step-2").model_dump_json().encode())
    fresh = _config(tiny_lm, data, tmp_path / "pod-b", store, "exact", export=True)
    # What a start that fails before its resume reports (lastCheckpointStep): the store's.
    assert DCPCheckpointer(fresh).latest_step() == 2
    exported: list[FinalExport] = []
    resumed = _train(fresh, exported=exported)
    assert sorted(resumed) == [3, 4]  # from step 2, not step 1, and not the partial step 4
    for step in (3, 4):
        assert resumed[step] == reference[step], step
    # The same weights and optimizer state, byte for byte: the shards' digests agree.
    again = _manifest(store, "exact", 4)
    assert {k: v.digest for k, v in again.files.items() if k.endswith(".distcp")} == shards_at_4

    # The final model landed in the store, its marker last; it loads as a user's would.
    assert exported[0].path == f"s3://{BUCKET}/exact/export" and exported[0].step == 4
    out = tmp_path / "export"
    for name in client.sizes("export/"):
        client.download(name, out / name.split("/", 1)[1])
    assert json.loads((out / "export.json").read_text())["step"] == 4
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert sum(p.numel() for p in model.parameters()) > 0


def test_the_store_down_mid_upload_delays_the_checkpoint_not_the_steps(
        tiny_lm: Path, store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    data = write_text_task(tmp_path / "t.jsonl")
    back_after_step_3: list[float] = []

    def on_step(step: int) -> None:
        if step == 1:  # the first save (step 2) finds the store gone
            store.server.stop()
        if step == 2:
            # Long enough for the ranks' first requests to give up (obstore's own retries,
            # a few seconds): step 3's look at the upload finds it retrying.
            time.sleep(10)
        if step == 3 and not back_after_step_3:
            # Step 3 trained while step 2's upload was failing. The store stays away a few
            # seconds more, past one request's own retries (the upload's loop must retry),
            # and comes back. (From this thread: the server dies with the thread that
            # started it.)
            time.sleep(5)
            back_after_step_3.append(time.monotonic())
            store.server.start()

    # Were the steps to wait for the upload, step 3 would never come: the deadline ends
    # the run instead of the test hanging.
    cfg = _config(tiny_lm, data, tmp_path / "pod", store, "outage", upload_deadline_s=90)
    uploads: dict[int, dict[str, object] | None] = {}
    with caplog.at_level(logging.INFO, logger="grpo_trainer.checkpointing"):
        try:
            metrics = _train(cfg, on_step, uploads=uploads)
        finally:
            store.server.start()
    assert sorted(metrics) == [1, 2, 3, 4]
    assert back_after_step_3, "step 3 did not train while the store was down"
    said = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("checkpoint step 2 is in the store") and "were retried" in m
               for m in said), said[-10:]
    # Both checkpoints completed once the store was back.
    assert _manifest(store, "outage", 2).step == 2
    assert _manifest(store, "outage", 4).step == 4
    # What the operator's CheckpointUpload condition was told, and showed: step 2's upload
    # retrying while step 3 trained, then the last checkpoint up.
    assert uploads[1] is None, uploads
    during, done = uploads[3], uploads[-1]
    assert during is not None and (during["state"], during["step"]) == ("Retrying", 2), uploads
    assert during["message"], uploads
    assert done is not None and (done["state"], done["step"]) == ("Uploaded", 4), uploads
    assert [_condition(during), _condition(done)] == [("False", "UploadRetrying"),
                                                      ("True", "Uploaded")]


def _condition(upload: dict[str, object]) -> tuple[str, str]:
    """The operator's CheckpointUpload condition for a progress report carrying `upload`."""
    from grpo_api.job.status import GRPOJobStatus
    from grpo_operator.reconcile.conditions import checkpoint_upload_conditions
    from grpo_trainer.liveness.progress import Progress

    progress = GRPOJobStatus.model_validate(
        {"progress": Progress(3, 4, 0.5, 2, checkpoint_upload=upload).to_status()}).progress
    new = checkpoint_upload_conditions(progress, [], 1, "2026-12-05T00:00:00Z")
    assert new is not None
    (c,) = new
    return c.status, c.reason


def test_refused_keys_stop_the_run_at_once_naming_the_secret(
        tiny_lm: Path, store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_text_task(tmp_path / "t.jsonl")
    # What the earlier attempt left: a complete checkpoint, which a refused start keeps.
    kept = store.client("refused")
    kept.put_bytes("step-2/" + MANIFEST, b"{}")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-key")
    cfg = _config(tiny_lm, data, tmp_path / "pod", store, "refused")
    with pytest.raises(StoreRefused) as info:
        DCPCheckpointer(cfg).restore(group=None, loader=None)  # type: ignore[arg-type]
    message = str(info.value)
    assert f"Secret '{SECRET}'" in message and "s3://checkpoints/refused" in message
    assert store.server.secret_key not in message and "not-the-key" not in message
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", store.server.secret_key)
    assert "step-2/" + MANIFEST in store.client("refused").sizes()


def test_an_upload_retries_until_the_store_returns_or_the_deadline(
        store: Store, tmp_path: Path) -> None:
    step = tmp_path / "step-6"
    step.mkdir()
    for name in ("__0_0.distcp", "rank-0.pt"):
        (step / name).write_bytes(os.urandom(1 << 20))
    cfg = ObjectStoreConfig(**store.cfg("retry", upload_deadline_s=60))
    store.server.stop()
    try:
        upload = RankUpload(ObjectStore(cfg), step, ["__0_0.distcp", "rank-0.pt"])
        # One try is the client's own retries (~2 s) and the backoff after it 1 s: wait
        # for the second failure, bounded well inside the 60 s deadline.
        until = time.monotonic() + 30
        while upload.status()["tries"] < 2 and time.monotonic() < until:
            time.sleep(0.2)
        assert not upload.poll(wait=False)
        status = upload.status()
        assert status["tries"] >= 2 and status["error"], status
    finally:
        store.server.start()
    assert upload.poll(wait=True)
    assert store.client("retry").sizes() == {"step-6/__0_0.distcp": 1 << 20,
                                             "step-6/rank-0.pt": 1 << 20}
    assert not list(step.iterdir())  # the local copies went once they were up

    (step / "rank-0.pt").write_bytes(b"x")
    short = ObjectStoreConfig(**store.cfg("retry", upload_deadline_s=2))
    store.server.stop()
    try:
        late = RankUpload(ObjectStore(short), step, ["rank-0.pt"])
        with pytest.raises(UploadFailed, match="upload_deadline_s 2"):
            late.poll(wait=True)
    finally:
        store.server.start()
    assert (step / "rank-0.pt").exists()  # not lost: still on the pod's disk
    shutil.rmtree(step)
