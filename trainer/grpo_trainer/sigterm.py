"""SIGTERM: the driver saves its last finished step, the ranks stay until it has.

A preemption, a drain or a suspend deletes the pods, and every process gets SIGTERM at
once. The driver's handler only notes it: the training loop lets the rank call in flight
return (a rank runs one method at a time, so nothing can start before it), keeps the step
if its update has finished and drops it otherwise (the loader is rewound), commits a
checkpoint of that step unless one exists, and ends with exit 143 (``Terminated``). The
ranks' handler defers their exit meanwhile: the driver ending (or killing them) ends them,
and ``RANK_DEFER_LIMIT_S`` bounds the wait should it never come.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

# A rank that got SIGTERM exits at the latest this long after it, whatever the driver
# does: the kubelet's SIGKILL at the end of the grace period comes first on a cluster
# (a save of the largest planned checkpoint takes minutes, never ten).
RANK_DEFER_LIMIT_S = 600.0


class Terminated(Exception):
    """The driver stopped on SIGTERM after committing its last finished step."""

    def __init__(self, step: int, saved: bool, save_s: float | None) -> None:
        what = (f"committed a checkpoint of step {step} in {save_s:.2f} s" if saved
                else f"step {step} was already checkpointed" if step else "no step finished")
        super().__init__(f"stopped on SIGTERM: {what}")
        self.step = step


class StepAbandoned(Exception):
    """SIGTERM came before this step's update: the step is dropped, not finished."""


class TermSignal:
    """The driver's SIGTERM flag: set by the handler, read by the training loop."""

    def __init__(self) -> None:
        self.at: float | None = None
        self._previous: Any = None

    @property
    def requested(self) -> bool:
        return self.at is not None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("not saving on SIGTERM: the trainer does not run in the main thread")
            return
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def restore(self) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.at is None:
            self.at = time.monotonic()
            log.warning("SIGTERM: saving the last finished step, then stopping")


def defer_in_rank(rank: int, limit_s: float = RANK_DEFER_LIMIT_S) -> bool:
    """In a rank's process (Ray actor, main thread): SIGTERM no longer ends it at once;
    it ends when the driver ends or kills it, or ``limit_s`` after the signal."""
    if threading.current_thread() is not threading.main_thread():
        log.warning("rank %d: SIGTERM not deferred (not on the main thread)", rank)
        return False

    def handle(signum: int, frame: FrameType | None) -> None:
        log.warning("rank %d: SIGTERM; staying up until the driver's save is committed "
                    "(at most %.0f s)", rank, limit_s)
        timer = threading.Timer(limit_s, os._exit, args=(143,))
        timer.daemon = True
        timer.start()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one timer is enough

    signal.signal(signal.SIGTERM, handle)
    return True
