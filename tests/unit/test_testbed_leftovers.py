"""A killed run's testbed work directory is removed by the next testbed; a live one's,
and a directory nothing marks as a testbed's, are not."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from grpo_testbed import leftovers

pytestmark = pytest.mark.unit


def _workdir(parent: Path, name: str, big: int = 0) -> Path:
    wd = parent / f"{leftovers.PREFIX}{name}"
    (wd / "node").mkdir(parents=True)
    (wd / "node" / "blob").write_bytes(b"x" * big)
    return wd


def test_a_dead_runs_directory_goes_with_its_orphans_and_a_live_ones_stays(
        tmp_path: Path) -> None:
    live = _workdir(tmp_path, "live")
    held = leftovers.hold(live)
    dead = _workdir(tmp_path, "dead", big=4096)
    leftovers.hold(dead).close()  # its process died: nobody holds the lock any more
    orphan = subprocess.Popen(["sh", "-c", "sleep 300", str(dead / "node")])
    unmarked = _workdir(tmp_path, "unmarked")
    try:
        assert leftovers.sweep(tmp_path) == [dead]
        assert not dead.exists()
        assert live.is_dir() and unmarked.is_dir()
        deadline = time.monotonic() + 10
        while orphan.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert orphan.returncode is not None, "the dead run's program was left running"
    finally:
        held.close()
        if orphan.poll() is None:
            orphan.kill()
    # Once its testbed stops, the live one's directory is fair game too.
    assert leftovers.sweep(tmp_path) == [live]
