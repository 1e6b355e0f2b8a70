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

The fence also records the job's uid (``GRPO_JOB_UID``): a job created again under the
same name, adopting the claim an earlier one left (checkpoint retention), takes the
directory over at its own attempt 0, and the earlier job's drivers are fenced out
(``tracker.taken_over_by``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..config_error import ConfigError
from .files import atomic_write
from .tracker import FENCE, Fence, parse_fence, superseded_by, taken_over_by

log = logging.getLogger(__name__)


class AttemptSupersededError(ConfigError):
    """A newer attempt (or a job created again under this name) owns the checkpoint
    directory: this driver must stop (exit 2, ConfigError: retrying this attempt cannot
    help; the operator ignores the pods of an attempt that is not its current one)."""

    def __init__(self, root: Path, mine: int, newer: int, what: str,
                 job_uid: str | None = None) -> None:
        by = (f"job {job_uid} (created again under this job's name)" if job_uid
              else f"attempt {newer}")
        super().__init__(
            "trainer.attempt",
            f"attempt {mine} is superseded: {by} has claimed checkpoint directory "
            f"{root} ({root / FENCE}); {what}",
        )
        self.attempt = mine
        self.newer = newer


def read_fence_record(root: Path) -> Fence | None:
    try:
        text = (root / FENCE).read_text()
    except (FileNotFoundError, NotADirectoryError):
        return None
    fence = parse_fence(text)
    if fence is None:
        log.warning("attempt fence %s is unreadable; ignoring it", root / FENCE)
    return fence


def read_fence(root: Path) -> int | None:
    fence = read_fence_record(root)
    return None if fence is None else fence.attempt


def claim(root: Path, attempt: int, job_uid: str | None = None) -> None:
    """Record ``attempt`` (of job ``job_uid``) as the directory's owner, or raise if a
    newer attempt of the same job owns it."""
    recorded = read_fence_record(root)
    earlier_job = taken_over_by(job_uid, recorded)
    if earlier_job is not None:
        assert recorded is not None
        log.info("job %s takes over checkpoint directory %s from job %s (attempt %d): it was "
                 "created again under the same name", job_uid, root, earlier_job,
                 recorded.attempt)
    else:
        newer = superseded_by(attempt, recorded.attempt if recorded else None)
        if newer is not None:
            raise AttemptSupersededError(
                root, attempt, newer, "this driver stops without touching it (set "
                f"trainer.attempt / GRPO_ATTEMPT to {newer} or more to take the directory over)",
            )
    mine = Fence(attempt=attempt, job_uid=job_uid)
    if recorded != mine:
        root.mkdir(parents=True, exist_ok=True)
        atomic_write(root / FENCE, mine.model_dump_json(exclude_none=True).encode())
        log.info("attempt %d claims checkpoint directory %s (was %s)", attempt, root,
                 recorded.attempt if recorded else None)


def check(root: Path, attempt: int, action: str, job_uid: str | None = None) -> None:
    """Right before ``action`` (saving or committing a step, which write and delete under
    ``root``): raise if a newer attempt, or a job created again under this name, has
    claimed ``root``."""
    recorded = read_fence_record(root)
    other = taken_over_by(job_uid, recorded)
    newer = superseded_by(attempt, recorded.attempt if recorded else None)
    if other is None and newer is None:
        return
    log.error("not %s: %s has claimed %s since attempt %d started", action,
              f"job {other}" if other else f"attempt {newer}", root, attempt)
    raise AttemptSupersededError(
        root, attempt, recorded.attempt if recorded else attempt,
        f"not {action}; this driver stops (uncommitted step directories are removed by the "
        "owner's start-up)", job_uid=other,
    )
