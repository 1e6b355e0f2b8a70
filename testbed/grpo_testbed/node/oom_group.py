"""A container that hits its memory limit dies whole, as on a cgroup v2 node.

On cgroup v2 the kubelet (since Kubernetes 1.28) sets `memory.oom.group` on every
container, so the kernel's OOM kill at a container's limit ends all of its processes and
the kubelet reports `OOMKilled`, exit 137. This machine has cgroup v1, where the kernel
kills one process, the one with the highest oom_score, and the container runs on: a
worker pod whose leaking rank was killed (Ray raises its workers' oom_score_adj to 1000,
so a rank goes first) would stay Running under its `ray start`, and nothing in the pod's
status would say that it ran out of memory. So the real node watches its containers'
memory cgroups, and when one records an OOM kill it SIGKILLs the processes left in it,
as `memory.oom.group` would: the container's first process is among them (exit 137),
and containerd, which saw the OOM event, reports the container `OOMKilled`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("grpo_testbed.node")

MEMORY_ROOT = Path("/sys/fs/cgroup/memory")
POLL_S = 0.1  # well inside the time the kubelet and Ray take to notice a dead process


def oom_kills(oom_control: str) -> int:
    """The `oom_kill` count of a cgroup v1 `memory.oom_control` file (0 if absent)."""
    for line in oom_control.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            return int(value)
    return 0


def newly_killed(before: Mapping[str, int], now: Mapping[str, int]) -> list[str]:
    """The containers whose OOM kill count rose (a container first seen with kills
    counts: it may have started and hit its limit between two looks)."""
    return sorted(c for c, n in now.items() if n > before.get(c, 0))


def memory_cgroup(proc_cgroup: str) -> str | None:
    """The memory controller's path in a `/proc/<pid>/cgroup` file (cgroup v1)."""
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return path
    return None


class OomGroupKill:
    """Watches the containers that this node's containerd runs (its task state
    directory: one entry per container id) and ends a container whole after an OOM kill."""

    def __init__(self, tasks: Path, memory_root: Path = MEMORY_ROOT) -> None:
        self.tasks = tasks
        self.memory_root = memory_root
        self.counts: dict[str, int] = {}
        self._cgroups: dict[str, Path] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="oom-group")

    def start(self) -> OomGroupKill:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _loop(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                self.check()
            except OSError as err:  # a container going away between two reads
                log.debug("oom group: %s", err)

    def check(self) -> list[str]:
        """One look at every container: returns those ended for an OOM kill."""
        now: dict[str, int] = {}
        for task in self.tasks.iterdir() if self.tasks.is_dir() else ():
            cgroup = self._cgroup(task)
            if cgroup is None:
                continue
            try:
                now[task.name] = oom_kills((cgroup / "memory.oom_control").read_text())
            except OSError:
                continue  # the container ended meanwhile
        ended = newly_killed(self.counts, now)
        for container in ended:
            n = kill_all(self._cgroups[container])
            log.info("container %s: the kernel OOM-killed a process at its memory limit; "
                     "its %d other processes killed too (memory.oom.group, as on cgroup v2)",
                     container[:12], n)
        self.counts = now
        self._cgroups = {c: p for c, p in self._cgroups.items() if c in now}
        return ended

    def _cgroup(self, task: Path) -> Path | None:
        if task.name not in self._cgroups:
            try:
                pid = (task / "init.pid").read_text().strip()
                path = memory_cgroup(Path(f"/proc/{pid}/cgroup").read_text())
            except (OSError, ValueError):
                return None  # not started yet, or already gone
            if path is None:
                return None
            self._cgroups[task.name] = self.memory_root / path.lstrip("/")
        return self._cgroups[task.name]


def kill_all(cgroup: Path, rounds: int = 20) -> int:
    """SIGKILL every process of a cgroup, again while any is left (one may fork)."""
    killed: set[int] = set()
    for _ in range(rounds):
        try:
            pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
        except OSError:
            break  # the cgroup is gone with its last process
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return len(killed)
