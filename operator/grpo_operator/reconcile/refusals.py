"""Ray pods the API server refuses to create (pure): shown within seconds, failed after
a deadline, never a silent Pending.

KubeRay (v1.6.1, `raycluster_controller.go` `calculateStatus`) records a refused pod
create on the RayCluster as the condition

    {type: ReplicaFailure, status: "True", reason: FailedCreateHeadPod | FailedCreateWorkerPod,
     message: "FailedCreateHeadPod\\n<the API server's error>", lastTransitionTime: ...}

(plus Warning events FailedToCreateHeadPod / FailedToCreateWorkerPod on the RayCluster),
keeps its lastTransitionTime while the refusals go on, and removes it once a create
succeeds. Admission refusals (Pod Security, ResourceQuota, LimitRange, another webhook)
do not go away by retrying the same pods, so after `deadline` seconds the attempt fails.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from grpo_api.contract import ATTEMPT_RUNNING, ConditionType, FailureReason, Reason
from grpo_api.job.status import GRPOJobStatus

from .action import Action
from .phases import Finding, is_pending
from .status import StatusFacts
from .stored import read_status

REPLICA_FAILURE = "ReplicaFailure"  # KubeRay's RayClusterReplicaFailure condition type
CREATE_REASONS = {"FailedCreateHeadPod": "head", "FailedCreateWorkerPod": "worker"}
FIX = ("change what refuses them (the namespace's Pod Security level, a ResourceQuota or "
       "LimitRange, an admission policy) or the job's spec.pods")


@dataclass(frozen=True)
class Refusal:
    """KubeRay cannot create a Ray pod: which one, the API server's words, since when."""

    role: str  # head or worker
    message: str
    since: str  # RFC 3339, the condition's lastTransitionTime


def pod_create_refusal(ray_cluster: dict[str, Any]) -> Refusal | None:
    """The RayCluster's refused pod create, or None."""
    for c in (ray_cluster.get("status") or {}).get("conditions") or []:
        reason = c.get("reason")
        if c.get("type") == REPLICA_FAILURE and c.get("status") == "True" and \
                reason in CREATE_REASONS:
            message = str(c.get("message") or "")
            first, _, rest = message.partition("\n")  # errors.Join(marker, err)
            return Refusal(CREATE_REASONS[reason], (rest if first == reason else message)
                           .strip() or reason, str(c.get("lastTransitionTime") or ""))
    return None


def _time(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _stamp(t: dt.datetime) -> str:
    return t.isoformat(timespec="seconds").replace("+00:00", "Z")


def refused(status: GRPOJobStatus, refusal: Refusal, rc_name: str, now: str,
            deadline_s: float, advice: str) -> Action:
    """Pending (Progressing and Degraded reason PodCreateRefused, the API server's
    message, one Warning event) until `deadline_s` after the first refusal; then the
    attempt fails for good (retrying the same pods cannot help) and the RayCluster goes,
    so KubeRay stops trying; its message says what deleting and re-creating the job does
    to its checkpoints (`advice`)."""
    since = _time(refusal.since) if refusal.since else _time(now)
    until = since + dt.timedelta(seconds=deadline_s)
    what = f"KubeRay cannot create the {refusal.role} pod of RayCluster {rc_name}"
    if _time(now) < until:
        found = Finding(Reason.POD_CREATE_REFUSED,
                        f"{what}: {refusal.message}. The attempt fails at {_stamp(until)} "
                        f"unless this is fixed: {FIX}")
        first = _progressing_reason(status) != Reason.POD_CREATE_REFUSED
        return Action(StatusFacts(found),
                      events=[("Warning", Reason.POD_CREATE_REFUSED, found.message)]
                      if first else [])
    seconds = int((_time(now) - since).total_seconds())
    found = Finding(Reason.POD_CREATE_REFUSED,
                    f"{what} for {seconds} s: {refusal.message}. Not retried: {FIX}, "
                    f"then delete the job and create it again ({advice})", final=True)
    attempt = status.attempt or 0
    ended = {"end_time": now, "outcome": FailureReason.ERROR.value, "reason": found.message}
    attempts = [a.model_copy(update=ended)
                if a.index == attempt and a.outcome == ATTEMPT_RUNNING else a
                for a in status.attempts]
    return Action(
        StatusFacts(found, record={"attempts": attempts}),
        delete_ray_cluster=rc_name,
        events=[("Warning", Reason.POD_CREATE_REFUSED, found.message)],
    )


def _progressing_reason(status: GRPOJobStatus) -> str | None:
    return next((c.reason for c in status.conditions
                 if c.type == ConditionType.PROGRESSING), None)


def refusal_pending(job: dict[str, Any]) -> bool:
    """A live job whose pods are being refused: its deadline must be checked again even
    when KubeRay writes nothing new on the RayCluster (it does not while the refusal
    stays the same). A handler's entry: Kopf hands it the job as stored."""
    return (refusal_shown(read_status(job.get("status")).status)
            and not (job.get("metadata") or {}).get("deletionTimestamp"))


def refusal_shown(status: GRPOJobStatus) -> bool:
    """The job shows a refused pod create (until KubeRay's condition goes, only a
    running job or the deadline replaces it)."""
    return (is_pending(status)
            and _progressing_reason(status) == Reason.POD_CREATE_REFUSED)
