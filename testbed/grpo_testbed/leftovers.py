"""Work directories of testbeds whose process was killed (a SIGKILLed test run, an
interrupted helper): a real node's leaves the trainer image's unpacked snapshot and pod
volumes behind, 20 GB and more, until the disk is full and the next run's image import
fails. A testbed holds a lock in its work directory for as long as it runs; a directory
whose lock nobody holds belonged to a dead run, and the next testbed that starts removes
it (its mounts first). Directories without a lock are left alone: nothing says whose."""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import IO

log = logging.getLogger("grpo_testbed")

PREFIX = "grpo-testbed-"
OWNER_LOCK = ".owner.lock"


def hold(workdir: Path) -> IO[bytes]:
    """Mark ``workdir`` as in use until the returned file is closed (or the process dies:
    the kernel drops the lock, and children do not inherit the descriptor)."""
    f = open(workdir / OWNER_LOCK, "wb")  # noqa: SIM115 - held for the testbed's life
    fcntl.flock(f.fileno(), fcntl.LOCK_EX)
    return f


def sweep(parent: Path | None = None) -> list[Path]:
    """Remove the work directories under ``parent`` (the temp dir) of dead testbeds."""
    removed = []
    for wd in sorted((parent or Path(tempfile.gettempdir())).glob(f"{PREFIX}*")):
        lock = wd / OWNER_LOCK
        if not lock.is_file():
            continue
        try:
            f = open(lock, "rb")  # noqa: SIM115 - closed below
        except OSError:
            continue
        try:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live testbed
            size = _size(wd)
            _kill_orphans(wd)
            _unmount_under(wd)
            shutil.rmtree(wd, ignore_errors=True)
            log.info("removed %s, left by a testbed whose process died (%.1f GB)", wd,
                     size / 1e9)
            removed.append(wd)
        finally:
            f.close()
    return removed


def _kill_orphans(wd: Path) -> None:
    """The dead run's programs that outlived it (containerd shims, a kubelet): any
    process whose command line names the directory."""
    needle = str(wd).encode()
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            if needle in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            continue


def _unmount_under(wd: Path) -> None:
    root = str(wd)
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()
              if line.split()[1] == root or line.split()[1].startswith(root + "/")]
    for m in sorted(mounts, key=len, reverse=True):
        subprocess.run(["umount", "-l", m], capture_output=True, check=False)


def _size(wd: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(wd):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total
