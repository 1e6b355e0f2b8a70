"""Where the operator's memory is (docs/troubleshooting.md, "The operator's memory"): when
Python's tracemalloc is on (``PYTHONTRACEMALLOC=1`` in the operator's environment), SIGUSR2
logs the live allocations by source file, largest first, and with ``PYTHONTRACEMALLOC=N``
(N frames) the largest call paths. Off otherwise: tracing slows every
allocation and costs memory of its own."""

from __future__ import annotations

import logging
import signal
import tracemalloc
from types import FrameType

log = logging.getLogger("grpo_operator")

TOP_FILES = 30
TOP_PATHS = 8  # with PYTHONTRACEMALLOC=N > 1: the largest call paths, N frames each


def install() -> bool:
    """Install the SIGUSR2 report where tracemalloc is tracing; whether it did."""
    if not tracemalloc.is_tracing():
        return False
    signal.signal(signal.SIGUSR2, _report)
    return True


def _report(_signum: int, _frame: FrameType | None) -> None:
    snapshot = tracemalloc.take_snapshot()  # one, for both views: taking it is the cost
    stats = snapshot.statistics("filename")
    total = sum(s.size for s in stats)
    log.warning("heap: %.1f MiB traced in %d files; the %d largest:", total / 2**20,
                len(stats), TOP_FILES)
    for s in stats[:TOP_FILES]:
        log.warning("heap: %8.1f KiB %7d blocks %s", s.size / 1024, s.count,
                    s.traceback[0].filename)
    if tracemalloc.get_traceback_limit() < 2:
        return
    # Which caller made them: the largest call paths, innermost frame first.
    for s in snapshot.statistics("traceback")[:TOP_PATHS]:
        log.warning("heap: path of %.1f KiB in %d blocks: %s", s.size / 1024, s.count,
                    " <- ".join(f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}"
                                for f in s.traceback))
