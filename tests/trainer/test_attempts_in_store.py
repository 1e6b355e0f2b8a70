"""A job with checkpoint.store and no claim: its pods share no directory, so what they
shared on the claim goes through the store (the testbed's real S3 server, versitygw):
the attempt's files (logs, events, stall stacks) are kept there, and the preStop hook of a
drained worker pod and the driver on the head find each other's markers there.

Each "pod" here is its own local directory; only the store is common to them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grpo_api.contract import ATTEMPT_EVENTS, attempt_dir
from grpo_api.trainer_config import ObjectStoreConfig
from grpo_testbed.s3_server import REGION, S3Server, standalone_s3_server
from grpo_trainer.liveness.attempt_keeper import AttemptKeeper
from grpo_trainer.liveness.prestop import wait_for_driver
from grpo_trainer.liveness.sigterm import AttemptFiles, TermSignal
from grpo_trainer.object_store import ObjectStore

pytestmark = pytest.mark.trainer

BUCKET = "jobs"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    s = standalone_s3_server(tmp_path_factory.mktemp("s3"))
    s.make_bucket(BUCKET)
    try:
        yield s
    finally:
        s.stop()


def store_cfg(server: S3Server, prefix: str, monkeypatch: pytest.MonkeyPatch
              ) -> ObjectStoreConfig:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", server.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", server.secret_key)
    return ObjectStoreConfig(uri=f"s3://{BUCKET}/{prefix}", endpoint=server.endpoint,
                             region=REGION, path_style=True, keep_attempts=True)


def test_the_attempts_files_are_kept_in_the_store_as_they_grow(
        server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = store_cfg(server, "team/keep", monkeypatch)
    pod = tmp_path / "head"
    logs = Path(attempt_dir(str(pod), 1))
    logs.mkdir(parents=True)
    (logs / "j-a1-head.log").write_text("step 1\n")
    (Path(attempt_dir(str(pod), 0)) / ATTEMPT_EVENTS).parent.mkdir(parents=True)
    (Path(attempt_dir(str(pod), 0)) / ATTEMPT_EVENTS).write_text("Scheduled Pod/j-a0-head\n")
    keeper = AttemptKeeper(pod, ObjectStore(cfg), interval_s=0.2)
    keeper.start()
    stored = server.root / BUCKET / "team/keep"
    head_log = stored / "attempts/1/j-a1-head.log"
    deadline = time.monotonic() + 20
    while not head_log.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert head_log.read_text() == "step 1\n"
    assert (stored / "attempts/0" / ATTEMPT_EVENTS).read_text() == "Scheduled Pod/j-a0-head\n"
    # The store away: the copy fails and says so, the run is not disturbed; back, the
    # log as it has grown meanwhile is kept by the last copy.
    server.stop()
    try:
        with (logs / "j-a1-head.log").open("a") as f:
            f.write("step 2\ntraining failed at step 2\n")
        assert keeper.sync() == 0
    finally:
        server.start()
    keeper.close()
    assert head_log.read_text() == "step 1\nstep 2\ntraining failed at step 2\n"
    assert keeper.sync() == 0  # nothing changed since: nothing sent again


def test_a_drained_worker_and_the_driver_find_each_others_markers_in_the_store(
        server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = store_cfg(server, "team/markers", monkeypatch)
    head = AttemptFiles.at(str(tmp_path / "head"), "uid-1", 2, cfg)
    worker = AttemptFiles.at(str(tmp_path / "worker"), "uid-1", 2, cfg)
    head.clear()
    term = TermSignal()
    term.watch(head)  # the driver polls for a stop request
    try:
        assert not worker.is_done()
        worker.request_stop("j-a2-cpu-worker-x7k2p")  # the drained pod's preStop hook
        deadline = time.monotonic() + 20
        while not term.requested and time.monotonic() < deadline:
            time.sleep(0.05)
        assert term.requested, "the driver never saw the worker pod's stop request"
        assert head.stop_requested() == "j-a2-cpu-worker-x7k2p"
    finally:
        term.restore()
    assert not wait_for_driver(worker.is_done, 0.5)
    head.write_done()  # after the save: the hook lets Ray on the worker stop
    assert wait_for_driver(worker.is_done, 10)
    # Another attempt (or uid) shares nothing with this one's.
    assert not AttemptFiles.at(str(tmp_path / "worker"), "uid-1", 3, cfg).is_done()
    # Without keep_attempts (a claim is shared) nothing goes to the store.
    claimed = AttemptFiles.at(str(tmp_path / "c"), "uid-1", 2,
                              cfg.model_copy(update={"keep_attempts": False}))
    assert claimed.store is None


def test_s3_data_is_fetched_once_and_a_missing_or_refused_one_fails_the_fetch_naming_it(
        server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub-fetch init container's `--s3` (spec.data.train: s3://...), as the operator
    renders its arguments: the object lands where the trainer is told to read it, whole; a
    second pod or attempt fetches nothing; a missing object or refused keys end the
    container with exit 1 and the reason (status.progress.fetch, the termination log)."""
    from grpo_api.contract import s3_local_path
    from grpo_trainer import hub_fetch

    cfg = store_cfg(server, "data", monkeypatch)
    data = b"".join(b'{"problem": "1+%d", "answer": "%d"}\n' % (i, i + 1) for i in range(5000))
    ObjectStore(cfg).put_bytes("geo3k/train.jsonl", data)
    uri = f"s3://{BUCKET}/data/geo3k/train.jsonl"
    reports: list[dict[str, object]] = []
    monkeypatch.setattr(hub_fetch, "_reporter", lambda: reports.append)
    monkeypatch.setattr(hub_fetch, "TERMINATION_LOG", str(tmp_path / "termination-log"))
    args = ["--root", str(tmp_path / "job"), "--s3", uri, "--s3-endpoint", server.endpoint,
            "--s3-region", REGION, "--s3-path-style", "--s3-keys-secret", "s3-keys"]
    assert hub_fetch.main(args) == 0
    local = Path(s3_local_path(str(tmp_path / "job"), uri))
    assert local.read_bytes() == data
    assert reports[-1]["state"] == "Fetched" and reports[-1]["bytesDone"] == len(data)
    before = local.stat().st_mtime_ns
    assert hub_fetch.main(args) == 0 and local.stat().st_mtime_ns == before  # kept
    missing = [a.replace("train.jsonl", "nope.jsonl") for a in args]
    assert hub_fetch.main(missing) == 1
    said = (tmp_path / "termination-log").read_text()
    assert "nope.jsonl" in said and "no such object" in said, said
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-key")
    (tmp_path / "job").rename(tmp_path / "other")  # nothing on the volume: it must ask
    assert hub_fetch.main(args) == 1
    said = (tmp_path / "termination-log").read_text()
    assert "Secret 's3-keys'" in said and server.secret_key not in said, said
    assert reports[-1]["state"] == "Failed"


def test_an_s3_model_is_read_for_the_plan_and_fetched_whole_once(
        server: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """spec.model.path: s3://bucket/prefix/: the reader pod's config.json read (what the
    operator plans from) and the hub-fetch step's `--s3-model`, as the operator renders
    them, against the real server."""
    import json

    from grpo_api.contract import s3_local_path
    from grpo_trainer import hub_fetch, store_fetch

    cfg = store_cfg(server, "models", monkeypatch)
    files = {"config.json": json.dumps({"model_type": "qwen2", "hidden_size": 64,
                                        "num_attention_heads": 4, "num_hidden_layers": 2,
                                        "intermediate_size": 128, "vocab_size": 1000,
                                        "num_key_value_heads": 2}).encode(),
             "model.safetensors": bytes(range(256)) * 4096, "tokenizer/vocab.json": b"{}"}
    for name, data in files.items():
        ObjectStore(cfg).put_bytes(f"tiny-lm/{name}", data)
    uri = f"s3://{BUCKET}/models/tiny-lm/"
    store = ["--s3-endpoint", server.endpoint, "--s3-region", REGION, "--s3-path-style",
             "--s3-keys-secret", "s3-keys"]
    out = tmp_path / "termination-log"
    assert store_fetch.main(["--config-of", uri, "--out", str(out), *store]) == 0
    report = json.loads(out.read_text())
    assert report["config"]["hidden_size"] == 64, report
    assert store_fetch.main(["--config-of", uri.replace("tiny-lm", "none"), "--out",
                             str(out), *store]) == 2
    assert "config.json: no such object" in json.loads(out.read_text())["error"]

    monkeypatch.setattr(hub_fetch, "_reporter", lambda: lambda _: None)
    args = ["--root", str(tmp_path / "job"), "--s3-model", uri, *store]
    assert hub_fetch.main(args) == 0
    local = Path(s3_local_path(str(tmp_path / "job"), uri.rstrip("/")))
    assert {str(p.relative_to(local)): p.read_bytes() for p in local.rglob("*")
            if p.is_file() and p.name != store_fetch.MARKER} == files
    server.stop()  # fetched whole: a later attempt asks the store nothing
    try:
        assert hub_fetch.main(args) == 0
    finally:
        server.start()
