"""Kueue admission as the job shows it (pure).

A job with spec.queueName gets Kueue's queue label on each attempt's RayCluster. Kueue's
webhook creates the cluster suspended (KubeRay makes no pods) and admission unsuspends
it; to preempt, Kueue suspends it again and KubeRay deletes every pod. The operator
never writes `spec.suspend` or the label: it reads them, and the cluster's Workload for
Kueue's own words. `status.rayCluster.admittedGeneration` remembers the generation at
which the live attempt's cluster was seen admitted: suspended at a later generation means
preempted; a copy of the cluster read before that (a Workload event's handler can hold
one while a cluster event is decided) says nothing new.
"""

from __future__ import annotations

import re
from typing import Any

from grpo_api.contract import ATTEMPT_RUNNING, KUEUE_QUEUE_LABEL, MAX_RESTARTS, KueueReason, Reason
from grpo_api.job.status import GRPOJobStatus, NextAttempt

from .action import Action
from .phases import Finding
from .status import StatusFacts
from .stored import reported_step

_REASON_SAFE = re.compile(r"[^A-Za-z0-9_,:]")


def queue_of(ray_cluster: dict[str, Any]) -> str | None:
    """The LocalQueue a RayCluster is queued in (Kueue's label), or None."""
    return (ray_cluster.get("metadata", {}).get("labels") or {}).get(KUEUE_QUEUE_LABEL)


def held_by_kueue(ray_cluster: dict[str, Any]) -> bool:
    """A queued cluster that Kueue keeps suspended: not admitted yet, or preempted."""
    return queue_of(ray_cluster) is not None and bool(
        (ray_cluster.get("spec") or {}).get("suspend"))


def admitted(status: GRPOJobStatus) -> bool:
    """Whether Kueue admitted the live attempt's cluster (seen unsuspended once)."""
    return admitted_generation(status) is not None


def admitted_generation(status: GRPOJobStatus) -> int | None:
    return status.ray_cluster.admitted_generation if status.ray_cluster is not None else None


def generation(ray_cluster: dict[str, Any]) -> int:
    return int(ray_cluster.get("metadata", {}).get("generation") or 0)


def preempted(ray_cluster: dict[str, Any], status: GRPOJobStatus) -> bool:
    """Kueue suspended the cluster after it was seen admitted."""
    seen = admitted_generation(status)
    return held_by_kueue(ray_cluster) and seen is not None and generation(ray_cluster) > seen


def _condition(workload: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for c in (workload or {}).get("status", {}).get("conditions") or []:
        if c.get("type") == kind:
            return dict(c)
    return {}


def _reason(text: str, fallback: Reason) -> KueueReason | Reason:
    """Kueue's reason as a condition reason (CamelCase; Kueue's already are)."""
    clean = _REASON_SAFE.sub("", text)
    return KueueReason(clean) if clean[:1].isalpha() else fallback


def queued_finding(ray_cluster: dict[str, Any], workload: dict[str, Any] | None,
                   cluster_queue: str | None) -> Finding:
    """Kueue's reason for holding the cluster (phase Queued): why the Workload has no
    quota yet (which ClusterQueue, which resource is short), or what admission still
    waits for."""
    queue = queue_of(ray_cluster)
    where = f"LocalQueue {queue}" + (f" (ClusterQueue {cluster_queue})" if cluster_queue
                                     else "")
    name = ray_cluster.get("metadata", {}).get("name")
    if workload is None:
        return Finding(Reason.WAITING_FOR_WORKLOAD,
                       f"RayCluster {name} is suspended in {where}; waiting for Kueue to "
                       "create its Workload (is Kueue running with the ray.io/raycluster "
                       "integration?)")
    reserved = _condition(workload, "QuotaReserved")
    if reserved.get("status") == "True":
        checks = _condition(workload, "Admitted")
        return Finding(_reason(str(checks.get("reason") or ""), Reason.ADMISSION_CHECKS_PENDING),
                       f"quota reserved in {where}; waiting for admission checks"
                       + (f": {checks['message']}" if checks.get("message") else ""))
    why = str(reserved.get("message") or "waiting for Kueue to consider the Workload")
    return Finding(_reason(str(reserved.get("reason") or ""), Reason.PENDING),
                   f"queued in {where}: {why}")


def admission_event(ray_cluster: dict[str, Any], workload: dict[str, Any] | None) -> str:
    admission = (workload or {}).get("status", {}).get("admission") or {}
    cq = admission.get("clusterQueue")
    return (f"Kueue admitted RayCluster {ray_cluster.get('metadata', {}).get('name')} from "
            f"LocalQueue {queue_of(ray_cluster)}" + (f" in ClusterQueue {cq}" if cq else ""))


def eviction_message(workload: dict[str, Any] | None) -> str:
    """Kueue's words for why it suspended an admitted cluster."""
    evicted = _condition(workload, "Evicted")
    if evicted.get("status") == "True":
        return f"{evicted.get('reason')}: {evicted.get('message')}"
    return "Kueue suspended the admitted RayCluster (its Workload was evicted)"


def preempt_attempt(status: GRPOJobStatus, workload: dict[str, Any] | None, now: str,
                    advice: str) -> Action:
    """Kueue took the live attempt's quota back: record it as Preempted (no restart
    counted, no backoff), release its cluster and queue the next attempt, which resumes
    from the newest complete checkpoint once Kueue admits it again. `advice`: what
    deleting and re-creating the job does to its checkpoints (said when no attempt
    numbers are left)."""
    attempt = status.attempt or 0
    live = next((a for a in status.attempts if a.index == attempt), None)
    if live is None or live.outcome != ATTEMPT_RUNNING:
        return Action()  # already recorded (cluster and pod events both report it)
    why = eviction_message(workload)
    progress = status.progress
    ended: dict[str, Any] = {"end_time": now, "outcome": Reason.PREEMPTED.value,
                             "reason": why[:4096]}
    if progress is not None:
        reached = {"step": reported_step(progress),
                   "last_checkpoint_step": progress.last_checkpoint_step}
        ended |= {k: v for k, v in reached.items() if v is not None}
    record = live.model_copy(update=ended)
    attempts = [record if a is live else a for a in status.attempts]
    rc = status.ray_cluster.name if status.ray_cluster is not None else None
    ckpt = record.last_checkpoint_step or 0
    if attempt >= MAX_RESTARTS:
        found = Finding(Reason.PREEMPTED,
                        f"attempt {attempt}: {why}; no attempt numbers left (at most "
                        f"{MAX_RESTARTS + 1} attempts); to go on from checkpoint step "
                        f"{ckpt}, delete the job and create it again ({advice})", final=True)
        return Action(StatusFacts(found, record={"attempts": attempts}),
                      delete_ray_cluster=rc, events=[("Warning", Reason.PREEMPTED,
                                                      found.message)])
    found = Finding(Reason.PREEMPTED,
                    f"attempt {attempt} preempted by Kueue ({why}); attempt {attempt + 1} "
                    f"queues again and resumes from checkpoint step {ckpt} (no restart "
                    "counted)", requeued=True)
    return Action(
        StatusFacts(found, record={
            "attempts": attempts, "preemptions": status.preemptions + 1,
            "next_attempt": NextAttempt(index=attempt + 1, not_before=now)}),
        delete_ray_cluster=rc,
        events=[("Warning", Reason.PREEMPTED, found.message)],
    )
