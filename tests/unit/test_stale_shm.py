"""A killed vLLM run's shared-memory segments are removed; a living run's never are."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import pytest

from grpo_trainer.rollout.stale_shm import (
    remove_stale_vllm_segments,
    segments_in_use,
    shm_names_in_maps,
    stale_segments,
)

pytestmark = pytest.mark.unit

# What a SIGKILLed TP=2 run left in /dev/shm on the CI machine (the first two), plus
# a pipeline-parallel group's and a 4-rank group's names of the same pattern.
VLLM = ["-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_1", "x-pp:1-[2-3]-cpushm_3",
        "-tp:0-[0-1-2-3]-cpushm_2"]
OTHER = ["psm_1f2e3d", "torch_123_456_0", "sem.mp-abc", "cpushm_0", "notes-cpushm"]

MAPS = """\
7f0000000000-7f0000100000 rw-s 00000000 00:1a 1234   /dev/shm/-tp:0-[0-1]-cpushm_0
7f0000100000-7f0000200000 rw-s 00000000 00:1a 1235   /dev/shm/-tp:0-[0-1]-cpushm_1 (deleted)
7f0000200000-7f0000300000 r-xp 00000000 08:01 99     /usr/lib/libc.so.6
7f0000300000-7f0000400000 rw-p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0      [stack]
"""


def test_maps_name_the_mapped_segments_deleted_or_not() -> None:
    assert shm_names_in_maps(MAPS) == {"-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_1"}


def test_only_unused_segments_of_vllms_pattern_are_stale() -> None:
    in_use = {"-tp:0-[0-1]-cpushm_1", "psm_1f2e3d"}
    assert stale_segments(VLLM + OTHER, in_use) == sorted(
        ["-tp:0-[0-1]-cpushm_0", "x-pp:1-[2-3]-cpushm_3", "-tp:0-[0-1-2-3]-cpushm_2"]
    )
    # A living run maps all of its group's segments: nothing of it is stale.
    assert stale_segments(VLLM[:2], set(VLLM[:2])) == []


def test_fake_proc_mapped_or_open_counts_as_in_use(tmp_path: Path) -> None:
    proc, shm = tmp_path / "proc", tmp_path / "shm"
    shm.mkdir()
    (proc / "10" / "fd").mkdir(parents=True)
    (proc / "10" / "maps").write_text(f"7f00-7f01 rw-s 0 00:1a 1 {shm}/-tp:0-[0-1]-cpushm_0\n")
    (proc / "11" / "fd").mkdir(parents=True)
    (proc / "11" / "maps").write_text("")
    os.symlink(f"{shm}/-tp:0-[0-1]-cpushm_1", proc / "11" / "fd" / "7")
    (proc / "self").mkdir()  # not a pid: skipped
    (proc / "12").mkdir()  # a process that exited mid-scan: no maps, no fd
    assert segments_in_use(proc, shm) == {"-tp:0-[0-1]-cpushm_0", "-tp:0-[0-1]-cpushm_1"}


def test_removes_a_dead_runs_segments_and_keeps_one_this_process_maps(tmp_path: Path) -> None:
    """Real /proc: this test process maps one segment like a living vLLM rank would."""
    dead, alive = tmp_path / "-tp:0-[0-1]-cpushm_0", tmp_path / "-tp:0-[0-1]-cpushm_1"
    unrelated = tmp_path / "psm_deadbeef"
    for p in (dead, alive, unrelated):
        p.write_bytes(b"\0" * 4096)
    with alive.open("r+b") as f, mmap.mmap(f.fileno(), 4096):
        assert remove_stale_vllm_segments(shm_dir=tmp_path) == [dead.name]
        assert not dead.exists() and alive.exists() and unrelated.exists()
    # Once nothing maps it, it is a dead run's too.
    assert remove_stale_vllm_segments(shm_dir=tmp_path) == [alive.name]
    assert remove_stale_vllm_segments(shm_dir=tmp_path / "absent") == []
