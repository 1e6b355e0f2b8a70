"""What one reconcile decision calls for (the Action the handler applies)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .conditions import JobEvent
from .retention import ClaimChange
from .status import StatusFacts, derive_status
from .stored import StoredStatus


@dataclass
class Action:
    """What one event calls for; the handler applies it: status first (one merge patch,
    only over the resourceVersion it was decided from), then the rest."""

    # What the step found; `reconcile` derives `status` from it (status.derive_status).
    # Not compared: two Actions that write and do the same are equal.
    facts: StatusFacts = field(default_factory=StatusFacts, compare=False)
    status: dict[str, Any] = field(default_factory=dict)  # merge patch; {}: nothing to write
    children: list[dict[str, Any]] = field(default_factory=list)  # create if absent
    delete_ray_cluster: str | None = None
    claim_change: ClaimChange | None = None  # the checkpoint claim's owner and labels
    delete_pod: str | None = None  # the model-config reader pod, once read
    events: list[JobEvent] = field(default_factory=list)
    retry: tuple[str, float] | None = None  # (why, seconds): cannot go on yet, decide again
    restart_reason: str | None = None  # an attempt failed and will be retried (metric)
    recovered_after: float | None = None  # seconds from a failure to the next attempt
    # How many times the planner ran for this decision (at most once: planning.Planner);
    # a metric, not part of what the action does.
    plans: int = field(default=0, compare=False)

    def derive(self, previous: StoredStatus, generation: int, now: str) -> Action:
        """This action with its status patch derived from its facts over `previous`, the
        status it was decided from (`reconcile` does this once per decision)."""
        self.status = derive_status(previous, self.facts, generation, now)
        return self
