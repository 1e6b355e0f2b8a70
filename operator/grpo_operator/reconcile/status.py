"""The job's status, computed once per decision (pure), as KubeRay's `calculateStatus`
computes a RayCluster's: the reconcile steps only record what they found (`StatusFacts`)
and `derive_status` turns the facts and the status before into the one merge patch the
handler writes, reduced to what changes ({}: nothing to write, as KubeRay writes status
only when it differs). The phase and its conditions come from the one table in
phases.py, applied here only."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

from grpo_api.job.status import (
    AttemptRecord,
    Condition,
    ExportStatus,
    ModelConfigStatus,
    NextAttempt,
    RayClusterStatus,
)

from .conditions import conditions_for
from .phases import Finding, phase_view
from .stored import StoredStatus, wire, wire_name


class StatusRecord(TypedDict, total=False):
    """What a step records, by GRPOJobStatus field (None removes the field); written in
    the stored form (stored.wire): a model's fields as read or set, nothing else."""

    attempt: int
    attempts: list[AttemptRecord]
    restarts: int
    preemptions: int
    next_attempt: NextAttempt | None
    ray_cluster: RayClusterStatus
    # The planner's whole PlanStatus.to_wire() (every field it resolved), as before.
    plan: dict[str, Any]
    read_model_config: ModelConfigStatus
    export: ExportStatus


@dataclass
class StatusFacts:
    """What one reconcile step found out about the job."""

    # What the step saw (an attempt's end, the pods' or Kueue's state, a refusal, a spec
    # problem, config.json being read): the reason the job shows, with its message and
    # whether the job gives up; None: the phase stands.
    seen: Finding | None = None
    # The record: attempts[], nextAttempt, restarts, preemptions, plan, rayCluster (name,
    # state, admittedGeneration), modelConfig, export.
    record: StatusRecord = field(default_factory=lambda: StatusRecord())
    # The conditions after the trainer's report (MemoryGrowth, HubFetch); None: unchanged.
    reported: list[Condition] | None = None


def derive_status(previous: StoredStatus, facts: StatusFacts, generation: int,
                  now: str) -> dict[str, Any]:
    """The status patch for `facts` over `previous` (the status the decision was made
    from): the phase and every phase condition `facts.seen` gives (phases.phase_view; their
    lastTransitionTime kept while they hold), the record, and observedGeneration, which
    moves with a decision on the job and not with the trainer's report alone."""
    conditions = facts.reported
    want: dict[str, Any] = {}
    if facts.seen is not None or facts.record:
        want[wire_name("observed_generation")] = generation
    want |= {wire_name(name): wire(value) for name, value in facts.record.items()}
    if facts.seen is not None:
        show = phase_view(facts.seen)
        want[wire_name("phase")] = show.phase
        conditions = conditions_for(show, facts.seen, generation, now,
                                    conditions if conditions is not None
                                    else previous.status.conditions)
    if conditions is not None:
        want[wire_name("conditions")] = wire(conditions)
    return {k: v for k, v in want.items() if _changes(previous.stored.get(k), v)}


def _changes(current: Any, patch: Any) -> bool:
    """Whether merging `patch` (RFC 7386) into `current` changes it."""
    if patch is None:
        return current is not None
    if isinstance(patch, dict) and isinstance(current, dict):
        return any(_changes(current.get(k), v) for k, v in patch.items())
    return bool(current != patch)
