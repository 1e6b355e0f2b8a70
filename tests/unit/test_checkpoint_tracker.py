"""Checkpoint layout: tracker, manifest checks, start-up cleanup, retention, durable writes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import xxhash

from grpo_trainer.checkpointing.dcp import DCPCheckpointer, committed_step
from grpo_trainer.checkpointing.files import (
    HashingWriter,
    atomic_write,
    digest_file,
    remove_step_dir,
    write_durable,
)
from grpo_trainer.checkpointing.tracker import (
    DCP_METADATA,
    MANIFEST,
    FileEntry,
    Tracker,
    balance,
    build_manifest,
    digest_problems,
    from_wire,
    is_due,
    parse_manifest,
    parse_step_dir,
    parse_tracker,
    plan_retention,
    plan_startup,
    size_problems,
    step_dir_name,
    to_wire,
)
from grpo_trainer.config import build_config

pytestmark = pytest.mark.unit


def test_step_directory_names_round_trip_and_nothing_else_parses() -> None:
    for step in (0, 1, 42, 10_000):
        assert parse_step_dir(step_dir_name(step)) == step
    for name in ("step-x", "step-1.tmp", "step--1", "latest", "step-", ".step-1"):
        assert parse_step_dir(name) is None


def test_tracker_must_be_whole_and_self_consistent() -> None:
    t = Tracker(step=7, dir="step-7")
    assert parse_tracker(t.model_dump_json()) == t
    assert parse_tracker('{"step": 7, "dir": "step-8"}') is None  # names another step
    assert parse_tracker('{"step": 7, "di') is None  # torn (never happens with rename)
    assert parse_tracker("") is None


def test_saves_fall_on_the_interval_and_at_the_end() -> None:
    assert [s for s in range(1, 8) if is_due(s, 3, final=s == 7)] == [3, 6, 7]
    assert [s for s in range(1, 5) if is_due(s, 0, final=s == 4)] == [4]


def _manifest(files: dict[str, int]) -> object:
    entries = {k: FileEntry(size, "0" * 64) for k, size in files.items()}
    return build_manifest(3, 2, "now", entries)


def test_size_problems_name_missing_truncated_files_and_missing_dcp_metadata() -> None:
    m = _manifest({DCP_METADATA: 10, "__0_0.distcp": 100, "__1_0.distcp": 100})
    assert size_problems(m, {DCP_METADATA: 10, "__0_0.distcp": 100, "__1_0.distcp": 100}) == []  # type: ignore[arg-type]
    problems = size_problems(m, {DCP_METADATA: 10, "__0_0.distcp": None, "__1_0.distcp": 60})  # type: ignore[arg-type]
    assert problems == [
        "__0_0.distcp is missing",
        "__1_0.distcp is 60 bytes, the manifest says 100",
    ]
    no_md = _manifest({"__0_0.distcp": 100})
    assert "no DCP metadata" in size_problems(no_md, {"__0_0.distcp": 100})[0]  # type: ignore[arg-type]


def test_digest_problems_catch_a_changed_byte_of_the_same_size() -> None:
    want = {"a": FileEntry(3, "aa" * 32), "b": FileEntry(3, "bb" * 32)}
    assert digest_problems(want, dict(want)) == []
    got = {"a": FileEntry(3, "aa" * 32), "b": FileEntry(3, "cc" * 32)}
    assert digest_problems(want, got) == [
        f"b has xxh3_128 {'c' * 12}..., expected xxh3_128 {'b' * 12}..."
    ]
    assert digest_problems(want, {"a": want["a"]}) == ["b is missing"]


def test_manifest_round_trips_and_junk_is_not_a_manifest() -> None:
    m = build_manifest(5, 4, "2026-01-01T00:00:00", {"x": FileEntry(1, "ab" * 32)})
    back = parse_manifest(m.model_dump_json())
    assert back is not None and back.entries() == {"x": FileEntry(1, "ab" * 32)}
    assert parse_manifest("{}") is None and parse_manifest("not json") is None


def test_a_format_1_sha256_manifest_still_parses_and_names_its_algorithm() -> None:
    # Verbatim shape of what saves before the xxh3 switch wrote.
    old = {
        "format": 1,
        "step": 4,
        "world_size": 2,
        "created_at": "2026-11-20T00:00:00+00:00",
        "files": {".metadata": {"size": 10, "sha256": "ab" * 32}},
    }
    m = parse_manifest(json.dumps(old))
    assert m is not None and m.algorithm == "sha256"
    assert m.entries() == {".metadata": FileEntry(10, "ab" * 32, "sha256")}
    # A digest of the right value but another algorithm is not a match.
    assert digest_problems(m.entries(), {".metadata": FileEntry(10, "ab" * 32)}) != []


def test_new_manifests_record_xxh3_and_refuse_mixed_algorithms() -> None:
    m = build_manifest(1, 1, "now", {"a": FileEntry(1, "0" * 32)})
    assert json.loads(m.model_dump_json())["algorithm"] == "xxh3_128"
    assert json.loads(m.model_dump_json())["format"] == 2
    with pytest.raises(ValueError, match="different algorithms"):
        build_manifest(1, 1, "now", {"a": FileEntry(1, "0"), "b": FileEntry(1, "0", "sha256")})
    e = FileEntry(5, "ff" * 16, "sha256")
    assert from_wire(to_wire(e)) == e
    with pytest.raises(ValueError, match="md5"):
        from_wire([5, "ff", "md5"])


def test_verification_is_balanced_over_ranks_by_bytes() -> None:
    files = {f"f{i}": FileEntry(size, "") for i, size in enumerate([90, 50, 40, 30, 10, 5])}
    parts = balance(files, 2)
    assert sorted(k for p in parts for k in p) == sorted(files)
    loads = [sum(e.size for e in p.values()) for p in parts]
    assert loads == [120, 105]  # largest first, each to the lighter rank
    assert balance(files, 1) == [files]
    assert balance({}, 3) == [{}, {}, {}]


def test_startup_removes_unfinished_and_uncommitted_saves() -> None:
    plan = plan_startup({1: True, 2: True, 3: False, 4: True}, tracker_step=2)
    assert plan.candidates == [2, 1]
    assert [s for s, _ in plan.remove] == [4, 3]
    assert "never committed" in dict(plan.remove)[4] and "incomplete" in dict(plan.remove)[3]
    # No tracker (the first save died before committing, or copied by hand): every
    # complete directory counts, newest first.
    assert plan_startup({1: True, 2: False, 3: True}, None).candidates == [3, 1]
    assert plan_startup({}, None).candidates == []


def test_retention_keeps_the_newest_and_never_the_latest() -> None:
    assert plan_retention({1: True, 2: True, 3: True, 4: True}, 4, keep=2) == [1, 2]
    # Newer than latest: an abandoned timeline (resumed from an older checkpoint).
    assert plan_retention({1: True, 2: True, 5: True, 6: False}, 2, keep=3) == [5, 6]
    # Incomplete leftovers are not counted among the kept and are deleted.
    assert plan_retention({1: True, 2: False, 3: True}, 3, keep=2) == [2]
    assert plan_retention({3: True}, 3, keep=1) == []
    assert 7 not in plan_retention({5: True, 6: True, 7: True}, 7, keep=1)


def test_hashing_writer_and_durable_writes_agree_with_xxh3(tmp_path: Path) -> None:
    data = bytes(range(256)) * 1000
    with open(tmp_path / "a", "wb") as raw:
        w = HashingWriter(raw)
        w.write(data[:100])
        w.write(memoryview(data)[100:])
    want = FileEntry(len(data), xxhash.xxh3_128_hexdigest(data), "xxh3_128")
    assert w.entry() == want == digest_file(tmp_path / "a")
    # The old algorithm, by name: what verifying a format-1 checkpoint uses.
    old = FileEntry(len(data), hashlib.sha256(data).hexdigest(), "sha256")
    assert digest_file(tmp_path / "a", "sha256") == old
    assert write_durable(tmp_path / "b", data) == want
    assert atomic_write(tmp_path / "c", b"old").size == 3
    assert atomic_write(tmp_path / "c", data) == want
    assert (tmp_path / "c").read_bytes() == data
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c"]  # no temp file left


def test_remove_step_dir_takes_the_marker_and_the_rest(tmp_path: Path) -> None:
    d = tmp_path / "step-3"
    d.mkdir()
    (d / MANIFEST).write_text("{}")
    (d / "__0_0.distcp").write_bytes(b"x")
    remove_step_dir(d)
    assert not d.exists()
    remove_step_dir(d)  # already gone: fine


def _cfg(ckpt: Path) -> object:
    return build_config(
        {
            "model": {"path": "m"},
            "data": {"train_files": ["t.jsonl"]},
            "checkpoint": {"dir": str(ckpt)},
        },
        environ={},
    )


def test_last_checkpoint_step_before_resume_is_what_a_restart_would_load(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    assert DCPCheckpointer(_cfg(ckpt)).latest_step() is None  # type: ignore[arg-type]
    (ckpt / "step-3").mkdir(parents=True)
    (ckpt / "step-3" / MANIFEST).write_text("{}")
    (ckpt / "step-5").mkdir()  # no marker: not a checkpoint
    assert committed_step(ckpt) == 3
    atomic_write(ckpt / "latest", Tracker(step=2, dir="step-2").model_dump_json().encode())
    assert DCPCheckpointer(_cfg(ckpt)).latest_step() == 2  # type: ignore[arg-type]
    assert DCPCheckpointer(_cfg(ckpt), resume=False).latest_step() is None  # type: ignore[arg-type]
