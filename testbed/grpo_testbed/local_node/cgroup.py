"""A memory cgroup per container, so a pod's memory limit gives a real kernel OOM kill.

Works with cgroup v1 (the memory controller's own hierarchy) and v2 (the unified
hierarchy with the memory controller enabled for children). The agent creates the
group under the cgroup it runs in, so it needs no privileges beyond writing there
(root on this testbed).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


class CgroupUnavailable(RuntimeError):
    pass


def _own_path(controller_line: str) -> str:
    return controller_line.split(":", 2)[2].strip()


def memory_parent(proc_cgroup: str | None = None, root: Path = CGROUP_ROOT) -> tuple[Path, int]:
    """The directory to create container groups under, and the cgroup version (1 or 2)."""
    text = proc_cgroup if proc_cgroup is not None else Path("/proc/self/cgroup").read_text()
    lines = text.splitlines()
    v1 = [ln for ln in lines if ln.split(":")[1:2] and "memory" in ln.split(":")[1].split(",")]
    if v1 and (root / "memory").is_dir():
        return root / "memory" / _own_path(v1[0]).lstrip("/"), 1
    v2 = [ln for ln in lines if ln.startswith("0::")]
    if v2 and (root / "cgroup.controllers").exists():
        return root / _own_path(v2[0]).lstrip("/"), 2
    raise CgroupUnavailable(
        "no writable memory cgroup (need cgroup v1 'memory' or v2 with the memory controller); "
        "the local node cannot enforce pod memory limits")


class MemoryCgroup:
    def __init__(self, name: str, limit_bytes: int | None) -> None:
        parent, self.version = memory_parent()
        self.path = parent / name
        try:
            self.path.mkdir(exist_ok=True)
        except OSError as err:
            raise CgroupUnavailable(f"cannot create {self.path}: {err}") from err
        if limit_bytes is not None:
            if self.version == 1:
                (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                # Without this, a limit would push pages to swap instead of killing.
                with contextlib.suppress(OSError):
                    (self.path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
            else:
                (self.path / "memory.max").write_text(str(limit_bytes))
                with contextlib.suppress(OSError):
                    (self.path / "memory.swap.max").write_text("0")

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        try:
            return [int(p) for p in self.procs_file.read_text().split()]
        except OSError:
            return []

    def oom_kills(self) -> int:
        """Processes the kernel killed for this group's limit so far."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            for line in (self.path / name).read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except OSError:
            pass
        return 0

    def peak_bytes(self) -> int:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            return int((self.path / name).read_text().strip())
        except (OSError, ValueError):
            return 0

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def remove(self, timeout_s: float = 10.0) -> None:
        """Kill what is left (daemons the container started) and remove the group."""
        deadline = time.monotonic() + timeout_s
        while self.pids() and time.monotonic() < deadline:
            self.kill_all()
            time.sleep(0.1)
        with contextlib.suppress(OSError):
            self.path.rmdir()
