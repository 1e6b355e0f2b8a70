"""What the job shows for what a step found (pure): the one table from a reason to the
job's phase and the phase conditions that hold. The steps report a `Finding` (the reason,
its message, and whether the job gives up on it); `status.derive_status` alone turns it
into the phase and conditions, as KubeRay's `calculateStatus` derives a RayCluster's
state in one place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from grpo_api.contract import (
    TERMINAL_PHASES,
    ConditionType,
    FailureReason,
    KueueReason,
    Phase,
    Reason,
)
from grpo_api.job.status import GRPOJobStatus


@dataclass(frozen=True)
class Finding:
    """What a reconcile step found: the reason the job shows now, in words."""

    reason: Reason | KueueReason  # Kueue's own reason for a queued job passes through
    message: str
    # The job gives up on it: retrying cannot help, or no restart (or attempt number) is
    # left. The job fails, whatever the reason shows while it is waited out.
    final: bool = False
    # Kueue took the attempt's quota back: the next attempt waits in its queue (Queued),
    # not for a backoff as after a failure (Restarting).
    requeued: bool = False

    @property
    def course(self) -> Course:
        """What the job does about it (COURSE_PHASE: the phase when not its reason's)."""
        if self.final:
            return Course.GIVES_UP
        if self.requeued:
            return Course.REQUEUED
        return Course.GOES_ON


class Course(Enum):
    """What the job does about a finding. The reason's phase (PHASE_OF) is the phase of a
    job that goes on; a job that gives up, or whose next attempt queues again, shows the
    course's phase (COURSE_PHASE) whatever the reason: the reason still says why."""

    GOES_ON = "goes on"
    GIVES_UP = "gives up"  # Finding.final: retrying cannot help, or nothing is left
    REQUEUED = "requeued"  # Finding.requeued: Kueue took the attempt's quota back


# The attempt failure classes: an attempt that ended so is restarted (with the next
# safer setting for a memory class) unless the job gives up (Finding.final).
# Never retried, so never Restarting. A ConfigError's config fails again. A
# CheckpointIncompatible attempt would fail the same way with the same plan, and starting
# from an older checkpoint or step 0 would drop trained steps without the user's say: the
# job fails with its checkpoint kept (docs/troubleshooting.md).
PERMANENT = (FailureReason.CONFIG_ERROR, FailureReason.CHECKPOINT_INCOMPATIBLE)
_RESTARTED = {Reason(r): Phase.RESTARTING for r in FailureReason
              if r is not FailureReason.SUCCEEDED and r not in PERMANENT}

# The phase each reason shows. A reason that is not a key is not a phase's reason (a
# condition's own, or an event's): a step that reported one would fail the decision.
PHASE_OF: Mapping[Reason, Phase] = {
    # Before an attempt exists
    Reason.CLAIM_MISSING: Phase.PENDING,
    Reason.WAITING_FOR_PREVIOUS_JOB: Phase.PENDING,
    Reason.READING_MODEL_CONFIG: Phase.PENDING,
    Reason.MODEL_CONFIG_UNAVAILABLE: Phase.PENDING,
    # The live attempt's cluster and pods
    Reason.CREATING_CLUSTER: Phase.PENDING,
    Reason.CREATE_FAILED: Phase.PENDING,
    Reason.WAITING_FOR_PODS: Phase.PENDING,
    Reason.UNSCHEDULABLE: Phase.PENDING,
    Reason.POD_CREATE_REFUSED: Phase.PENDING,
    Reason.PODS_STARTING: Phase.STARTING,
    Reason.CLUSTER_RUNNING: Phase.RUNNING,
    # Kueue holds the cluster (its own reasons are Queued too: `phase_view`)
    Reason.WAITING_FOR_WORKLOAD: Phase.QUEUED,
    Reason.ADMISSION_CHECKS_PENDING: Phase.QUEUED,
    Reason.PENDING: Phase.QUEUED,
    # Between attempts
    **_RESTARTED,
    Reason.WAITING_FOR_PREVIOUS_ATTEMPT: Phase.RESTARTING,
    Reason.SUSPENDED_BY_USER: Phase.SUSPENDED,
    # The end
    Reason.TRAINING_FINISHED: Phase.SUCCEEDED,
    Reason.CONFIG_ERROR: Phase.FAILED,  # never retried
    Reason.CHECKPOINT_INCOMPATIBLE: Phase.FAILED,  # never retried
    Reason.INVALID_NAME: Phase.FAILED,
    Reason.INVALID_SPEC: Phase.FAILED,
    Reason.INFEASIBLE: Phase.FAILED,
    Reason.INTERNAL_ERROR: Phase.FAILED,
}

# The phase of a finding whose course overrides its reason's (Finding.course).
COURSE_PHASE: Mapping[Course, Phase] = {
    Course.GIVES_UP: Phase.FAILED,
    Course.REQUEUED: Phase.QUEUED,
}
# Kueue's own reasons for holding a cluster (KueueReason, passed through) are Queued.
KUEUE_PHASE = Phase.QUEUED

# Faults the job waits out (a refused create, an unreachable hub): Degraded holds, with
# the fault's reason, beside the phase's own conditions, until it passes or is final.
FAULTS = frozenset({Reason.CREATE_FAILED, Reason.POD_CREATE_REFUSED,
                    Reason.MODEL_CONFIG_UNAVAILABLE})

# The phase conditions that hold in each phase (the others are False).
HOLDS: Mapping[Phase, frozenset[ConditionType]] = {
    Phase.PENDING: frozenset({ConditionType.PROGRESSING}),
    Phase.QUEUED: frozenset({ConditionType.QUEUED}),  # Kueue holds it: not progressing
    Phase.STARTING: frozenset({ConditionType.PROGRESSING}),
    Phase.RUNNING: frozenset({ConditionType.READY, ConditionType.PROGRESSING}),
    Phase.RESTARTING: frozenset({ConditionType.PROGRESSING, ConditionType.DEGRADED}),
    Phase.SUSPENDED: frozenset({ConditionType.SUSPENDED}),
    Phase.SUCCEEDED: frozenset({ConditionType.SUCCEEDED}),
    Phase.FAILED: frozenset({ConditionType.FAILED}),
}


@dataclass(frozen=True)
class JobPhaseView:
    """The phase a finding gives the job, and the phase conditions that hold then."""

    phase: Phase
    holds: frozenset[ConditionType]


def phase_view(finding: Finding) -> JobPhaseView:
    """The table applied to one finding (status.derive_status calls this, nothing else)."""
    if finding.course in COURSE_PHASE:
        phase = COURSE_PHASE[finding.course]
    elif not isinstance(finding.reason, Reason):
        phase = KUEUE_PHASE
    else:
        phase = PHASE_OF[finding.reason]
    fault = finding.reason in FAULTS and finding.course is not Course.GIVES_UP
    return JobPhaseView(phase, HOLDS[phase] | ({ConditionType.DEGRADED} if fault else frozenset()))


# Transition guards: what the job's phase (and status) allows a step to do next, read
# here only, beside the table that sets the phase.

# Phases in which the Ray pods and cluster say nothing new: the job ended, is
# suspended, or waits for its next attempt (whose cluster does not exist yet).
QUIET = (*TERMINAL_PHASES, Phase.SUSPENDED, Phase.RESTARTING)


def has_ended(status: GRPOJobStatus) -> bool:
    """Succeeded or Failed: nothing more happens to the job."""
    return status.phase in TERMINAL_PHASES


def has_failed(status: GRPOJobStatus) -> bool:
    return status.phase == Phase.FAILED


def is_running(status: GRPOJobStatus) -> bool:
    """The live attempt's pods all run (its driver reports progress)."""
    return status.phase == Phase.RUNNING


def is_pending(status: GRPOJobStatus) -> bool:
    return status.phase == Phase.PENDING


def is_queued(status: GRPOJobStatus) -> bool:
    return status.phase == Phase.QUEUED


def is_suspended(status: GRPOJobStatus) -> bool:
    return status.phase == Phase.SUSPENDED


def awaits_restart(status: GRPOJobStatus) -> bool:
    """A next attempt waits (its backoff, or Kueue): the restart timer owns the next step."""
    return status.next_attempt is not None


def attempt_settled(status: GRPOJobStatus) -> bool:
    """The current attempt is not the spec's to ensure: the job ended, or the restart
    timer starts the next attempt."""
    return has_ended(status) or awaits_restart(status)


def starts_cluster(status: GRPOJobStatus) -> bool:
    """Ensuring the attempt creates its cluster anew (a new job, or a resumed one): any
    other phase follows the live attempt's pods and cluster, not the spec."""
    return status.phase is None or is_suspended(status)


def is_live(status: GRPOJobStatus, attempt_label: str | None) -> bool:
    """Whether a pod or cluster labelled with attempt `attempt_label` can change the job:
    one of its live attempt, which has not ended (a preempted attempt waits for the next
    one as Queued, not Restarting). A job without attempts has none: pods and clusters
    labelled with its name then are an earlier job's of that name, going away."""
    return (status.phase not in QUIET and not awaits_restart(status)
            and bool(status.attempts) and is_current_attempt(status, attempt_label))


def is_current_attempt(status: GRPOJobStatus, attempt_label: str | None) -> bool:
    return attempt_label == str(status.attempt or 0)
