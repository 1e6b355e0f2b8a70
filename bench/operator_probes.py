"""What bench_operator.py reads of the operator's processes (the operator's and its
admission process): memory and CPU time from /proc, a quantile of one of its Prometheus
histograms, and py-spy samples of it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from pathlib import Path


def proc_usage(pid: int) -> tuple[float, float, float]:
    """The process's peak RSS and RSS now (MiB), and its CPU seconds (user + system)."""
    status = Path(f"/proc/{pid}/status").read_text()
    kib = {ln.split(":")[0]: int(ln.split()[1]) for ln in status.splitlines()
           if ln.startswith(("VmHWM", "VmRSS"))}
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return kib["VmHWM"] / 1024, kib["VmRSS"] / 1024, ticks / 100


def children(pid: int) -> list[int]:
    """The process's children (the operator's: its admission process)."""
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except FileNotFoundError:
        return []


ROLLUP_FIELDS = ("Pss", "Pss_Anon", "Pss_File")


def rollup_kib(pid: int) -> dict[str, int]:
    """The process's PSS, and its anonymous and file-backed shares (KiB), from
    /proc/PID/smaps_rollup; empty once the process is gone."""
    try:
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except FileNotFoundError:
        return {}
    return {ln.split(":")[0]: int(ln.split()[1]) for ln in rollup.splitlines()
            if ln.split(":")[0] in ROLLUP_FIELDS}


def pss_mib(pids: list[int]) -> float:
    """The processes' proportional set size together (MiB): pages they share (the forked
    admission process keeps the operator's imported modules) counted once, as the pod's
    memory cgroup charges them."""
    return sum(rollup_kib(pid).get("Pss", 0) for pid in pids) / 1024


class PssPeak:
    """The highest PSS of a process and its children together, sampled every second, and
    at that sample each process's anonymous and file-backed shares: file pages (the
    shared libraries' code) are what the kernel can reclaim under a memory limit, the
    anonymous ones (Python's heap) are not."""

    def __init__(self, pid: int, interval_s: float = 1.0) -> None:
        self.pid, self.interval_s, self.peak_mib = pid, interval_s, 0.0
        self.at_peak: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            pids = [self.pid, *children(self.pid)]
            rollups = [rollup_kib(pid) for pid in pids]
            total = sum(r.get("Pss", 0) for r in rollups) / 1024
            if total > self.peak_mib:
                self.peak_mib = total
                self.at_peak = {
                    f"{who}_{field.lower()}_mib": r.get(field, 0) / 1024
                    for who, r in zip(("operator", "admission"), rollups, strict=False)
                    for field in ROLLUP_FIELDS}

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak_mib


def histogram_quantile(metrics_text: str, name: str, q: float) -> float:
    """Prometheus' ``histogram_quantile`` of one unlabelled histogram in a scrape: linear
    within the bucket the quantile falls in (the upper bound past the last finite one)."""
    buckets: list[tuple[float, float]] = []
    for line in metrics_text.splitlines():
        if line.startswith(name + "_bucket{"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
    buckets.sort()
    if not buckets or buckets[-1][1] == 0:
        return float("nan")
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-9)
        lower, below = upper, count
    return lower


def sample_operator(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling the operator into ``out``:
    collapsed stacks, ``frame;frame;... count`` (SIGINT makes it write them)."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--py-spy needs py-spy: install the bench extra")
    # --gil: only the thread holding the GIL, i.e. the Python CPU the webhooks and the
    # event loop wait for; --nonblocking: the operator is not paused to be sampled.
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "50", "--gil",
                             "--nonblocking", "--format", "raw", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
