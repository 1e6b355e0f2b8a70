"""The operator's own progress deadline (pure): a Running attempt whose driver reported
nothing for too long is ended as Hang.

The trainer ends a hung run itself (exit 6, with every rank's stacks), but a driver
that is itself stuck (frozen, stopped, its monitor thread gone) reports nothing and
exits never. Its last sign of life is the newest of: when the attempt became Running
(the Ready condition), the last step report (progress.updatedAt) and the last stage
mark (the stage of a step it entered: progress.stage, at progress.stageAt). The
deadline is the trainer's own rule (the stall timeout, or `STALL_STEP_MULTIPLE` x the
step time, whichever is larger) plus a grace in which the trainer's verdict, which says
more, would have arrived (OperatorConfig.hang_grace_seconds).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from grpo_api.contract import ATTEMPT_RUNNING, STALL_STEP_MULTIPLE, ConditionType, FailureReason
from grpo_api.job.status import AttemptRecord, GRPOJobStatus

from .action import Action
from .attempts import finish_attempt
from .classify import PodOutcome
from .phases import awaits_restart, is_running
from .planning import Planner
from .stored import read_status, reported_step

# How often the operator looks (a timer per Running job): late by at most this much.
PROGRESS_CHECK_INTERVAL_S = 30.0


def _time(stamp: str | None) -> dt.datetime | None:
    if not stamp:
        return None
    try:
        t = dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class Silence:
    """How long the live attempt's driver has said nothing, and its deadline."""

    since: dt.datetime  # its last sign of life
    running: dt.datetime  # when this attempt became Running (older reports are not its)
    seconds: float
    deadline_s: float
    step_s: float | None  # the step time estimated from this attempt's reports

    @property
    def overdue(self) -> bool:
        return self.seconds > self.deadline_s


def _running_since(status: GRPOJobStatus) -> dt.datetime | None:
    ready = next((c for c in status.conditions if c.type == ConditionType.READY), None)
    if ready is None or ready.status != "True":
        return None
    return _time(ready.last_transition_time)


def _live_record(status: GRPOJobStatus) -> AttemptRecord | None:
    return next((a for a in status.attempts if a.index == status.attempt), None)


def step_estimate_s(status: GRPOJobStatus, running: dt.datetime) -> float | None:
    """Seconds per step of this attempt: from Running to its last step report, over the
    steps it made. Loading and the first step's engine start are in it, so it is high,
    which only makes the deadline longer (never a false Hang)."""
    progress = status.progress
    if progress is None:
        return None
    reported = _time(progress.updated_at)
    record = _live_record(status)
    resumed = record.resumed_from_step if record is not None else None
    made = progress.step - (resumed or 0)
    if reported is None or reported <= running or made <= 0:
        return None
    return (reported - running).total_seconds() / made


def silence(status: GRPOJobStatus, stall_timeout_s: int, now: str,
            grace_s: float) -> Silence | None:
    """The live attempt's silence, or None where no deadline applies: not Running (pods
    starting, queued, restarting, ended), or the stall timeout is 0 (never)."""
    if not is_running(status) or awaits_restart(status) or stall_timeout_s <= 0:
        return None
    running = _running_since(status)
    current = _time(now)
    if running is None or current is None:
        return None
    progress = status.progress
    reports = (progress.updated_at, progress.stage_at) if progress is not None else ()
    marks = [t for t in (_time(r) for r in reports) if t is not None]
    since = max([running, *marks])  # an earlier attempt's reports are older than Running
    step_s = step_estimate_s(status, running)
    deadline = max(float(stall_timeout_s), STALL_STEP_MULTIPLE * (step_s or 0.0)) + grace_s
    return Silence(since, running, (current - since).total_seconds(), deadline, step_s)


def end_silent_attempt(status: GRPOJobStatus, planner: Planner, now: str,
                       grace_s: float) -> Action:
    """The timer's decision: nothing while the driver reports in time; once it is
    overdue, the attempt ends as Hang and restarts like one the trainer ended (same plan,
    the collective debug env, counted towards backoffLimit). Idempotent: an ended attempt
    is not Running any more."""
    if planner.spec is None:
        return Action()  # the spec's own events say why
    stall = planner.spec.recovery.stall_timeout_seconds
    quiet = silence(status, stall, now, grace_s)
    if quiet is None or not quiet.overdue:
        return Action()
    record = _live_record(status)
    if record is None or record.outcome != ATTEMPT_RUNNING:
        return Action()
    progress = status.progress
    step = reported_step(progress)
    last = f"step {step}" if step is not None else "no step yet"
    stage = progress.stage if progress is not None else None  # the stage of a step
    marked = _time(progress.stage_at) if progress is not None else None
    if stage and marked is not None and marked >= quiet.running:
        last += f", stage {stage}"
    estimate = f", a step ~{quiet.step_s:.0f} s" if quiet.step_s is not None else ""
    message = (f"the driver reported no progress for {quiet.seconds:.0f} s (deadline "
               f"{quiet.deadline_s:.0f} s: recovery.stallTimeoutSeconds {stall}"
               f"{estimate}, + {grace_s:g} s grace); last report: {last} at "
               f"{quiet.since.isoformat().replace('+00:00', 'Z')}; no stacks: the driver "
               "itself is stuck or gone (see the head pod's log)")
    outcome = PodOutcome(FailureReason.HANG, None, message, step,
                         progress.last_checkpoint_step if progress is not None else None)
    return finish_attempt(status, outcome, now, planner)


def progress_watched(job: dict[str, Any]) -> bool:
    """The progress timer runs for Running jobs only (and not while one is deleted). A
    handler's entry: Kopf hands it the job as stored."""
    return (is_running(read_status(job.get("status")).status)
            and not (job.get("metadata") or {}).get("deletionTimestamp"))
