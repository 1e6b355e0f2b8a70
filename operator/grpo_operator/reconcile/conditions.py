"""Job phase and conditions from what the cluster shows (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_api.contract import (
    ATTEMPT_LABEL,
    PHASE_CONDITIONS,
    ROLE_LABEL,
    ConditionType,
    KueueReason,
    Phase,
    Reason,
    Role,
    not_reason,
)


@dataclass(frozen=True)
class PhaseView:
    phase: Phase
    reason: Reason | KueueReason
    message: str


# A Kubernetes event on the job: (type Normal or Warning, reason, message).
JobEvent = tuple[str, Reason, str]


def role(pod: dict[str, Any]) -> str:
    return str(pod.get("metadata", {}).get("labels", {}).get(ROLE_LABEL, ""))


def attempt_of(obj: dict[str, Any]) -> str | None:
    """The attempt a Ray pod or RayCluster belongs to (its ATTEMPT_LABEL)."""
    return (obj.get("metadata", {}).get("labels") or {}).get(ATTEMPT_LABEL)


def unschedulable(pod: dict[str, Any]) -> str | None:
    """Why the scheduler cannot place the pod, or None."""
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message") or c.get("reason") or "not scheduled")
    return None


def unschedulable_view(pod: dict[str, Any]) -> PhaseView | None:
    why = unschedulable(pod)
    if why is None:
        return None
    return PhaseView(Phase.PENDING, Reason.UNSCHEDULABLE,
                     f"pod {pod['metadata']['name']} cannot be scheduled: {why}")


# KubeRay's RayCluster .status.state once every Ray pod is running and ready.
RAY_CLUSTER_READY = "ready"


def attempt_phase(ray_cluster: dict[str, Any] | None, pods: list[dict[str, Any]],
                  workers_expected: int) -> PhaseView:
    """Pending / Starting / Running for the live attempt (terminal outcomes come from
    classify_pod on the head)."""
    if ray_cluster is None:
        return PhaseView(Phase.PENDING, Reason.CREATING_CLUSTER, "creating the RayCluster")
    live = [p for p in pods if not p.get("metadata", {}).get("deletionTimestamp")]
    for p in live:
        view = unschedulable_view(p)
        if view:
            return view
    heads = [p for p in live if role(p) == Role.HEAD]
    workers = [p for p in live if role(p) != Role.HEAD]
    running = [p for p in live if p.get("status", {}).get("phase") == "Running"]
    if (ray_cluster.get("status") or {}).get("state") == RAY_CLUSTER_READY or (
            heads and len(running) == len(live) and len(workers) >= workers_expected):
        return PhaseView(Phase.RUNNING, Reason.CLUSTER_RUNNING,
                         f"head and {workers_expected} worker pod(s) running")
    if not heads:
        return PhaseView(Phase.PENDING, Reason.WAITING_FOR_PODS,
                         "waiting for KubeRay to create the head pod")
    return PhaseView(Phase.STARTING, Reason.PODS_STARTING,
                     f"{len(running)} of {1 + workers_expected} Ray pods running")


_TRUE_FOR: dict[str, set[str]] = {
    Phase.PENDING: {"Progressing"},
    Phase.QUEUED: {"Queued"},  # Kueue holds it: waiting, not progressing
    Phase.STARTING: {"Progressing"},
    Phase.RUNNING: {"Ready", "Progressing"},
    Phase.RESTARTING: {"Progressing", "Degraded"},
    Phase.SUSPENDED: {"Suspended"},
    Phase.SUCCEEDED: {"Succeeded"},
    Phase.FAILED: {"Failed"},
}


def conditions_for(view: PhaseView, generation: int, now: str,
                   previous: list[dict[str, Any]] | None = None,
                   degraded: PhaseView | None = None) -> list[dict[str, Any]]:
    """All six conditions for a phase; lastTransitionTime kept while status holds.

    Conditions of other types (MemoryGrowth, from the trainer's report) are kept.
    """
    before = {c.get("type"): c for c in previous or []}
    true_types = set(_TRUE_FOR.get(view.phase, set()))
    if degraded:
        true_types.add("Degraded")
    out = []
    for t in PHASE_CONDITIONS:
        status = "True" if t in true_types else "False"
        src = degraded if (t == "Degraded" and degraded) else view
        reason, message = (src.reason, src.message) if status == "True" or t in (
            "Ready", "Progressing") else (not_reason(t), "")
        old = before.get(t)
        ltt = old["lastTransitionTime"] if old and old.get("status") == status else now
        out.append({"type": t.value, "status": status, "reason": reason, "message": message,
                    "lastTransitionTime": ltt, "observedGeneration": generation})
    return out + [c for c in previous or [] if c.get("type") not in PHASE_CONDITIONS]


MEMORY_GROWTH = ConditionType.MEMORY_GROWTH


def memory_growth_conditions(progress: dict[str, Any] | None,
                             conditions: list[dict[str, Any]] | None, generation: int,
                             now: str) -> list[dict[str, Any]] | None:
    """The conditions with MemoryGrowth following the trainer's latest report, or None
    when nothing changes. The trainer's leak detector writes ``progress.memoryGrowth``
    (a message) while it sees sustained growth; its absence in a report clears it."""
    message = (progress or {}).get("memoryGrowth")
    current = next((c for c in conditions or [] if c.get("type") == MEMORY_GROWTH), None)
    if message:
        want = {"status": "True", "reason": Reason.SUSTAINED_GROWTH, "message": str(message)}
    elif current is not None and current.get("status") == "True" and progress:
        want = {"status": "False", "reason": Reason.NO_GROWTH, "message": ""}
    else:
        return None
    return _with_condition(conditions, MEMORY_GROWTH, want, generation, now)


def _with_condition(conditions: list[dict[str, Any]] | None, kind: str, want: dict[str, str],
                    generation: int, now: str) -> list[dict[str, Any]] | None:
    """`conditions` with the one of type `kind` set to `want`; None if it already is."""
    current = next((c for c in conditions or [] if c.get("type") == kind), None)
    if current is not None and all(current.get(k) == v for k, v in want.items()):
        return None
    ltt = current["lastTransitionTime"] if current is not None and \
        current.get("status") == want["status"] else now
    cond = {"type": str(kind), **want, "lastTransitionTime": ltt, "observedGeneration": generation}
    return [c for c in conditions or [] if c.get("type") != kind] + [cond]


HUB_FETCH = ConditionType.HUB_FETCH


def hub_fetch_conditions(progress: dict[str, Any] | None,
                         conditions: list[dict[str, Any]] | None, generation: int,
                         now: str) -> list[dict[str, Any]] | None:
    """The conditions with HubFetch following the head's fetch report (bytes done of
    total, the file), or None when nothing changes."""
    fetch = (progress or {}).get("fetch")
    if not fetch:
        return None
    done, total = int(fetch.get("bytesDone") or 0), int(fetch.get("bytesTotal") or 0)
    size = f"{done / 2**30:.2f} of {total / 2**30:.2f} GiB"
    state = fetch.get("state")
    if state == "Fetched":
        want = {"status": "True", "reason": Reason.FETCHED, "message": f"{fetch['repo']}: {size}"}
    elif state == "Failed":
        want = {"status": "False", "reason": Reason.FETCH_FAILED,
                "message": str(fetch.get("message") or fetch["repo"])}
    else:
        want = {"status": "False", "reason": Reason.FETCHING,
                "message": f"{fetch['repo']}: {size}, now {fetch.get('file') or '-'}"}
    return _with_condition(conditions, HUB_FETCH, want, generation, now)
