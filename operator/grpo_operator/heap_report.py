"""Where the operator's memory is (docs/troubleshooting.md, "The operator's memory"): when
Python's tracemalloc is on (``PYTHONTRACEMALLOC=1`` in the operator's environment), SIGUSR2
logs the live allocations by source file, largest first. Off otherwise: tracing slows every
allocation and costs memory of its own."""

from __future__ import annotations

import logging
import signal
import tracemalloc
from types import FrameType

log = logging.getLogger("grpo_operator")

TOP_FILES = 30


def install() -> bool:
    """Install the SIGUSR2 report where tracemalloc is tracing; whether it did."""
    if not tracemalloc.is_tracing():
        return False
    signal.signal(signal.SIGUSR2, _report)
    return True


def _report(_signum: int, _frame: FrameType | None) -> None:
    stats = tracemalloc.take_snapshot().statistics("filename")
    total = sum(s.size for s in stats)
    log.warning("heap: %.1f MiB traced in %d files; the %d largest:", total / 2**20,
                len(stats), TOP_FILES)
    for s in stats[:TOP_FILES]:
        log.warning("heap: %8.1f KiB %7d blocks %s", s.size / 1024, s.count,
                    s.traceback[0].filename)
