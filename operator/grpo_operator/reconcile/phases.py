"""What the job shows for what a step found (pure): the one table from a reason to the
job's phase and the phase conditions that hold. The steps report a `Finding` (the reason,
its message, and whether the job gives up on it); `status.derive_status` alone turns it
into the phase and conditions, as KubeRay's `calculateStatus` derives a RayCluster's
state in one place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from grpo_api.contract import ConditionType, FailureReason, KueueReason, Phase, Reason


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
    if finding.final:
        phase = Phase.FAILED
    elif finding.requeued or not isinstance(finding.reason, Reason):
        phase = Phase.QUEUED
    else:
        phase = PHASE_OF[finding.reason]
    fault = finding.reason in FAULTS and not finding.final
    return JobPhaseView(phase, HOLDS[phase] | ({ConditionType.DEGRADED} if fault else frozenset()))
