"""The testbed's log shipper keeps what a container wrote after the kubelet removes its
pod's logs, including the last lines written just before (an archive that copied once a
second lost a driver's final lines when the operator deleted its pod at once)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_testbed.node.log_archive import LogArchive

pytestmark = pytest.mark.unit


def _write(path: Path, *lines: str) -> None:
    with path.open("a") as f:
        for line in lines:
            f.write(f"2026-11-26T17:00:00.000000000Z stderr F {line}\n")


def _head_log(tmp_path: Path) -> tuple[Path, LogArchive]:
    """A head container's log as the kubelet keeps it, and an archive watching it."""
    logs = tmp_path / "pods"
    src = logs / "demo_tiny-a1-head-x_u1" / "ray-head" / "0.log"
    src.parent.mkdir(parents=True)
    return src, LogArchive(logs, tmp_path / "archive")


def test_lines_written_after_the_last_look_survive_the_pods_removal(tmp_path: Path) -> None:
    src, archive = _head_log(tmp_path)
    _write(src, "step 3")
    archive.sync()
    _write(src, "SIGTERM: committed a checkpoint of step 4")
    src.unlink()  # the kubelet deletes the pod's logs with the pod, before the next look
    (pod,) = archive.pods("demo", "tiny-a1-head")
    assert archive.text(pod) == "step 3\nSIGTERM: committed a checkpoint of step 4\n"


def test_a_rotated_log_keeps_its_old_lines_first(tmp_path: Path) -> None:
    src, archive = _head_log(tmp_path)
    _write(src, "old")
    archive.sync()
    src.rename(src.with_name("0.log.20261126-170000"))  # the kubelet's rotation
    _write(src, "new")
    archive.sync()
    (pod,) = archive.pods("demo")
    assert archive.text(pod) == "old\nnew\n"
