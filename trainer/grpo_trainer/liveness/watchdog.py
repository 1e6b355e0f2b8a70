"""Memory watchdog: per-process memory each step, and a detector for sustained growth.

docs/incidents.md #4: a slow host-memory leak (references never released) grew RSS
linearly until Ray killed the workers a few steps later; nothing said "leak"
before the kill. Here every step records host RSS of the driver and of every
rank (and CUDA allocated/reserved/peak memory on GPUs), and a detector flags a
series whose growth is sustained:

- the least-squares slope over the last ``window_steps`` samples (after
  ``warmup_steps``, while allocators and caches settle) is at least
  ``threshold_mib_per_step``;
- both halves of the window grow at >= half that rate, so one step change (a
  cache filling once) that then stays flat is not a leak;
- at least ``min_positive_fraction`` of the step-to-step deltas are positive.

Pure logic; the driver feeds it and publishes what it says.
"""

from __future__ import annotations

import itertools
import logging
import re
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

log = logging.getLogger(__name__)

MiB = 1024 * 1024

# The per-step memory series the detector watches, with their names in messages.
WATCHED = {
    "host_rss_bytes": "host RSS",
    "gpu_allocated_bytes": "GPU memory allocated",
    # The card as the driver sees it: growth outside torch's allocator too (NCCL, CUDA
    # graphs, vLLM's own mappings), which torch's figure cannot show.
    "gpu_device_used_bytes": "GPU memory used on the device",
}


@dataclass(frozen=True)
class DetectorSettings:
    window_steps: int = 20
    warmup_steps: int = 5
    threshold_mib_per_step: float = 2.0
    min_positive_fraction: float = 0.6

    @property
    def threshold_bytes(self) -> float:
        return self.threshold_mib_per_step * MiB


@dataclass(frozen=True)
class Growth:
    """The detector's reading of one series at one step."""

    slope: float  # bytes per step over the window (0 until the window is full)
    flagged: bool
    steps: int  # samples in the window


def slope(values: Sequence[float]) -> float:
    """Least-squares slope of ``values`` against 0, 1, 2, ... (per step)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean_x = (n - 1) / 2
    mean_y = sum(values) / n
    sxx = sum((i - mean_x) ** 2 for i in range(n))
    sxy = sum((i - mean_x) * (v - mean_y) for i, v in enumerate(values))
    return sxy / sxx


def assess(window: Sequence[float], settings: DetectorSettings) -> Growth:
    """Is the growth over this (full) window sustained and above the threshold?"""
    n = len(window)
    if n < max(settings.window_steps, 4):
        return Growth(0.0, False, n)
    s = slope(window)
    half = n // 2
    halves = (slope(window[: half + 1]), slope(window[half:]))
    deltas = [b - a for a, b in itertools.pairwise(window)]
    positive = sum(1 for d in deltas if d > 0) / len(deltas)
    flagged = (
        s >= settings.threshold_bytes
        and min(halves) >= settings.threshold_bytes / 2
        and positive >= settings.min_positive_fraction
    )
    return Growth(s, flagged, n)


class LeakDetector:
    """One series (one process, one kind of memory): a sliding window after warm-up."""

    def __init__(self, settings: DetectorSettings) -> None:
        self.settings = settings
        self.seen = 0
        self.window: deque[float] = deque(maxlen=settings.window_steps)

    def observe(self, value: float) -> Growth:
        self.seen += 1
        if self.seen <= self.settings.warmup_steps:
            return Growth(0.0, False, 0)
        self.window.append(value)
        return assess(list(self.window), self.settings)


_SERIES = re.compile(r"^memory/(driver|rank\d+)/(\w+)$")


def process_label(process: str) -> str:
    return process.replace("rank", "rank ") if process.startswith("rank") else process


def describe(process: str, kind: str, growth: Growth) -> str:
    """E.g. "host RSS of rank 1 grew 4.1 MiB/step over the last 20 steps"."""
    what = WATCHED.get(kind, kind)
    return (
        f"{what} of {process_label(process)} grew {growth.slope / MiB:.1f} MiB/step "
        f"over the last {growth.steps} steps"
    )


class MemoryWatchdog:
    """Feeds every per-process memory series of a step to its own detector."""

    def __init__(self, settings: DetectorSettings) -> None:
        self.settings = settings
        self.detectors: dict[tuple[str, str], LeakDetector] = {}
        self.flagged: dict[tuple[str, str], str] = {}

    def observe(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Reads ``memory/<process>/<kind>``; returns growth metrics to publish."""
        out: dict[str, float] = {}
        for key, value in metrics.items():
            m = _SERIES.match(key)
            if m is None or m.group(2) not in WATCHED:
                continue
            series = (m.group(1), m.group(2))
            det = self.detectors.setdefault(series, LeakDetector(self.settings))
            growth = det.observe(float(value))
            prefix = f"memory/{series[0]}/{series[1].removesuffix('_bytes')}"
            out[f"{prefix}_growth_bytes_per_step"] = growth.slope
            out[f"{prefix}_growth_flag"] = float(growth.flagged)
            if growth.flagged:
                message = describe(*series, growth)
                if series not in self.flagged:
                    log.warning("memory growth: %s", message)
                self.flagged[series] = message
            elif self.flagged.pop(series, None) is not None:
                log.info("memory growth of %s stopped", process_label(series[0]))
        out["memory/growth_flag"] = float(bool(self.flagged))
        return out

    @property
    def message(self) -> str | None:
        """For the job's status: every series flagged now, or None."""
        return "; ".join(self.flagged.values()) if self.flagged else None


def per_process_memory(per_rank: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """``memory/<kind>`` of each rank's update() result -> ``memory/rank<r>/<kind>``."""
    out: dict[str, float] = {}
    for rank, result in enumerate(per_rank):
        for key, value in result.items():
            if key.startswith("memory/") and key.count("/") == 1:
                out[f"memory/rank{rank}/{key.removeprefix('memory/')}"] = float(value)
    return out


def driver_memory() -> dict[str, float]:
    import psutil

    return {"memory/driver/host_rss_bytes": float(psutil.Process().memory_info().rss)}
