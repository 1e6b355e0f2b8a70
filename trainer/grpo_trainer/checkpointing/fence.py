"""Attempt fencing: a driver of an older attempt never commits into the job's directory.

The operator numbers attempts (``GRPO_ATTEMPT``). At start a driver claims
``<dir>/attempt`` (``tracker.FENCE``) unless a newer attempt already holds it; before
each commit (manifest, then tracker) it reads the fence again. So once attempt N+1 has
started, a driver of attempt N still running somewhere (a partitioned node, a head pod
that has not died yet) cannot move ``latest`` or delete step directories: its
uncommitted step directory is left without a manifest, and the owner's start-up removes
it as incomplete. A save checks too, before it clears and creates its step directory
(which may be one the new attempt wrote). A check and the write after it are separate
system calls: a driver that stalls between them can still write once. The new attempt
claims before it reads ``latest`` and long before its first save, so the window is the
few milliseconds between a check and its write.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..config import ConfigError
from .files import atomic_write
from .tracker import FENCE, Fence, parse_fence, superseded_by

log = logging.getLogger(__name__)


class AttemptSupersededError(ConfigError):
    """A newer attempt owns the checkpoint directory: this driver must stop (exit 2,
    ConfigError: retrying this attempt cannot help; the operator ignores the pods of an
    attempt that is not its current one)."""

    def __init__(self, root: Path, mine: int, newer: int, what: str) -> None:
        super().__init__(
            "trainer.attempt",
            f"attempt {mine} is superseded: attempt {newer} has claimed checkpoint directory "
            f"{root} ({root / FENCE}); {what}",
        )
        self.attempt = mine
        self.newer = newer


def read_fence(root: Path) -> int | None:
    try:
        text = (root / FENCE).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    fence = parse_fence(text)
    if fence is None:
        log.warning("attempt fence %s is unreadable; ignoring it", root / FENCE)
        return None
    return fence.attempt


def claim(root: Path, attempt: int) -> None:
    """Record ``attempt`` as the directory's owner, or raise if a newer one owns it."""
    recorded = read_fence(root)
    newer = superseded_by(attempt, recorded)
    if newer is not None:
        raise AttemptSupersededError(
            root, attempt, newer, "this driver stops without touching it (set trainer.attempt / "
            f"GRPO_ATTEMPT to {newer} or more to take the directory over)",
        )
    if recorded != attempt:
        root.mkdir(parents=True, exist_ok=True)
        atomic_write(root / FENCE, Fence(attempt=attempt).model_dump_json().encode())
        log.info("attempt %d claims checkpoint directory %s (was %s)", attempt, root, recorded)


def check(root: Path, attempt: int, action: str) -> None:
    """Right before ``action`` (saving or committing a step, which write and delete under
    ``root``): raise if a newer attempt has claimed ``root``."""
    newer = superseded_by(attempt, read_fence(root))
    if newer is not None:
        log.error(
            "not %s: attempt %d has claimed %s since attempt %d started", action, newer, root,
            attempt,
        )
        raise AttemptSupersededError(
            root, attempt, newer, f"not {action}; this driver stops (uncommitted step "
            "directories are removed by the owner's start-up)",
        )
