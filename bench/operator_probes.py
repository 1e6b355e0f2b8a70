"""What bench_operator.py reads of the operator's process: its memory and CPU time from
/proc, a quantile of one of its Prometheus histograms, and py-spy samples of it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def proc_usage(pid: int) -> tuple[float, float, float]:
    """The process's peak RSS and RSS now (MiB), and its CPU seconds (user + system)."""
    status = Path(f"/proc/{pid}/status").read_text()
    kib = {ln.split(":")[0]: int(ln.split()[1]) for ln in status.splitlines()
           if ln.startswith(("VmHWM", "VmRSS"))}
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return kib["VmHWM"] / 1024, kib["VmRSS"] / 1024, ticks / 100


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
