"""Progress reports to the operator: the protocol the driver calls once per step.

The Kubernetes implementation (patching ``status.progress`` with its own field
manager) is in ``kube_progress``; here are the interface, a no-op and a JSON-file
reporter (used by tests and handy for local runs).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from grpo_api.contract import PROGRESS_MIN_INTERVAL_S


@dataclass
class Progress:
    step: int
    total_steps: int
    reward_mean: float | None = None
    last_checkpoint_step: int | None = None
    updated_at: str = field(default_factory=lambda: datetime.now(UTC).isoformat())
    # The memory watchdog's message while a process's memory grows, e.g. "host RSS
    # of rank 1 grew 4.1 MiB/step over the last 20 steps"; the operator turns it
    # into a MemoryGrowth condition.
    memory_growth: str | None = None
    # The newest validation pass (validation.py): its mean reward and step.
    val_reward_mean: float | None = None
    val_step: int | None = None
    # The newest save's measured seconds, start to commit (a save on SIGTERM too): what
    # the pods' termination grace period must cover.
    save_seconds: float | None = None
    # The transport NCCL chose (nccl_log.Transport.to_dict() plus its attempt), known on
    # the first attempt, whose ranks log NCCL's INIT/NET lines.
    transport: dict[str, object] | None = None
    # Rows left out as unreadable so far (data.bad_rows: skip), at load and when drawn.
    bad_rows: int | None = None
    # The attempt's highest memory readings (driver.measured_peaks), beside status.plan.peaks.
    measured_peaks: dict[str, object] | None = None
    # With checkpoint.store: the newest save's upload (Checkpointer.upload_status).
    checkpoint_upload: dict[str, object] | None = None

    def to_status(self) -> dict[str, object]:
        """camelCase keys as in GRPOJob.status.progress. Every field is sent, unset
        ones as null: the report is a merge patch, where an absent key keeps the old
        value and only null removes it (a growth that stopped must clear)."""
        d = asdict(self)
        status: dict[str, object] = {
            "step": d["step"],
            "totalSteps": d["total_steps"],
            "rewardMean": d["reward_mean"],
            "lastCheckpointStep": d["last_checkpoint_step"],
            "updatedAt": d["updated_at"],
            "memoryGrowth": self.memory_growth or None,
        }
        if self.save_seconds is not None:  # left out until this attempt has saved
            status["saveSeconds"] = round(self.save_seconds, 3)
        # Left out, not null, until this attempt validates: a merge patch then keeps the
        # value an earlier attempt reported.
        if self.val_step is not None:
            status["valRewardMean"] = self.val_reward_mean
            status["valStep"] = self.val_step
        # Left out when unknown: a later attempt (no NCCL log read) keeps the first one's.
        if self.transport is not None:
            status["transport"] = self.transport
        if self.bad_rows is not None:
            status["badRows"] = self.bad_rows
        if self.measured_peaks is not None:  # a restart's first report replaces the object
            status["measuredPeaks"] = self.measured_peaks
        if self.checkpoint_upload is not None:  # every key sent: null clears the message
            status["checkpointUpload"] = self.checkpoint_upload
        return status


class ProgressReporter(Protocol):
    def report(self, progress: Progress, *, force: bool = False) -> None: ...

    def stage_entered(self, stage: str) -> None:
        """The driver entered `stage` of a step (rollout, update, checkpoint...): a
        sign of life between step reports, rate-limited like them."""


class NullProgressReporter:
    def report(self, progress: Progress, *, force: bool = False) -> None:
        return None

    def stage_entered(self, stage: str) -> None:
        return None


class JsonFileProgressReporter:
    """Writes the latest progress atomically; rate-limited like the real reporter."""

    def __init__(self, path: str | Path, min_interval_s: float = PROGRESS_MIN_INTERVAL_S) -> None:
        self.path = Path(path)
        self.min_interval_s = min_interval_s
        self._last = float("-inf")

    def report(self, progress: Progress, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self.min_interval_s:
            return
        self._last = now
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        tmp.write_text(json.dumps(progress.to_status()))
        os.replace(tmp, self.path)

    def stage_entered(self, stage: str) -> None:
        return None  # the file holds the step reports the tests and local runs read
