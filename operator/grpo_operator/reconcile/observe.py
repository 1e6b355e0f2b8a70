"""What a decision reads (pure): the events `reconcile` decides on, what a handler
gathers for each (`Observed`), and the predicates by which a handler reads only what
the event needs (a pending pod's many events cost no API call). core.py decides."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_api.contract import Role
from grpo_api.job.status import GRPOJobStatus

from ..node_shapes import NodeShape
from .classify import LOST_RANKS, PodOutcome, classify_pod, worker_outcome
from .conditions import RAY_CLUSTER_READY, attempt_of, pod_phase, role, unschedulable
from .model_config import HubAnswer
from .phases import QUIET, awaits_restart, is_current_attempt, is_live, is_running
from .queue import admitted, held_by_kueue, queue_of
from .stored import read_status


@dataclass(frozen=True)
class SpecChanged:
    """The job was created, edited, or seen again at operator start."""


@dataclass(frozen=True)
class BackoffTimer:
    """The restart timer ticked (the job has status.nextAttempt)."""


@dataclass(frozen=True)
class ProgressTimer:
    """The progress deadline's timer ticked (the job is Running)."""


@dataclass(frozen=True)
class JobChanged:
    """Any change of the job, e.g. the trainer's progress report."""


@dataclass(frozen=True)
class PodChanged:
    """A Ray pod of the job changed or was deleted."""

    pod: dict[str, Any]
    deleted: bool = False


@dataclass(frozen=True)
class ClusterChanged:
    """The job's RayCluster changed (KubeRay writes its status as pods become ready)."""

    ray_cluster: dict[str, Any]


@dataclass(frozen=True)
class CreateFailed:
    """The API server refused a child the last Action asked for (quota, admission, RBAC):
    reported in status and an event, and tried again, not left as a silent
    CreatingCluster."""

    kind: str
    name: str
    message: str  # the API server's own words (kube.api_message)


Event = (SpecChanged | BackoffTimer | ProgressTimer | JobChanged | PodChanged
         | ClusterChanged | CreateFailed)


@dataclass(frozen=True)
class Observed:
    """What the handler read besides the job, for the events that need it."""

    # The checkpoint claim (spec.checkpoint.claimName, or the operator's <job>-checkpoints,
    # which may be kept from an earlier job of this name).
    claim: dict[str, Any] | None = None
    model_claim: dict[str, Any] | None = None  # the PVC spec.model.claimName names
    # The cluster's Ray pods; for the restart timer, every pod of the job; for a job
    # without attempts yet, the pods labelled with its name (an earlier job's).
    pods: list[dict[str, Any]] = field(default_factory=list)
    # Read when a pod is deleted: deleting a namespace deletes the pods before the job,
    # which would otherwise read as a node loss and start a restart nothing can create.
    namespace_terminating: bool = False
    # Kueue (spec.queueName): for a cluster event, the cluster's Workload and the
    # ClusterQueue its LocalQueue feeds; for a Ray pod going away, the live attempt's
    # RayCluster (suspended by Kueue: preempted) and its Workload.
    workload: dict[str, Any] | None = None
    cluster_queue: str | None = None
    ray_cluster: dict[str, Any] | None = None
    # For a new job whose config.json is read (model_config.to_read): the operator's GET
    # of the hub, or the reader pod (None: not created yet).
    hub: HubAnswer | None = None
    model_reader: dict[str, Any] | None = None
    # The GPU types' schedulable Nodes (node_shapes.py), which the plan sizes pods for;
    # None: not read (the catalog's figures, named as assumed).
    nodes: dict[str, NodeShape] | None = None


def _status(job: dict[str, Any]) -> GRPOJobStatus:
    """The job's status, read for one of the predicates below (each is a handler's entry:
    Kopf hands it the job as stored)."""
    return read_status(job.get("status")).status


def restart_pending(job: dict[str, Any]) -> bool:
    """The restart timer runs only for a job waiting out a backoff, and never for one
    being deleted: deleting a namespace deletes the head pod first, which reads as a
    failure, and the timer would try to start the next attempt where nothing can be
    created any more."""
    meta = job.get("metadata") or {}
    stored = read_status(job.get("status"))
    # One that does not read runs it too: the decision says why the job cannot go on.
    waits = awaits_restart(stored.status) or stored.unread("next_attempt")
    return waits and not meta.get("deletionTimestamp")


def restart_due(job: dict[str, Any], now: str) -> bool:
    """Whether the restart timer's next decision needs the job's pods: once the backoff
    has passed (the next attempt starts only when the earlier ones' pods are gone)."""
    nxt = _status(job).next_attempt
    return nxt is not None and now >= nxt.not_before


def ended(pod: dict[str, Any], deleted: bool = False) -> PodOutcome | None:
    """How a Ray pod's end ends its attempt, by its role; None while it has not."""
    if role(pod) == Role.HEAD:
        return classify_pod(pod, deleted=deleted)
    return worker_outcome(pod, deleted=deleted)


def pod_matters(event: PodChanged) -> bool:
    """Whether a pod event can change the job: a Ray pod that ended or was deleted while
    it ran (a worker's end ends the attempt too: its ranks are gone), one the scheduler
    cannot place, or a running one (the job may now be Running: noticed from the pods at
    once, not when KubeRay next writes the cluster's status). Pending pods' many other
    events cost no API call."""
    pod = event.pod
    if ended(pod, event.deleted) is not None:
        return True
    if event.deleted or pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return unschedulable(pod) is not None or pod_phase(pod) == "Running"


def pod_needs_pods(job: dict[str, Any], event: PodChanged) -> bool:
    """Whether deciding on this pod event needs the attempt's other pods: a running pod
    of a job not yet Running (Running depends on all its pods), and a head that lost its
    ranks (a worker that ended first tells why: the pod that died decides)."""
    status = _status(job)
    if status.phase in QUIET or not is_current_attempt(status, attempt_of(event.pod)):
        return False
    if role(event.pod) == Role.HEAD:
        head = classify_pod(event.pod, deleted=event.deleted)
        if head is not None and head.reason in LOST_RANKS:
            return True
    return not is_running(status) and pod_phase(event.pod) == "Running"


def cluster_needs_pods(job: dict[str, Any], ray_cluster: dict[str, Any]) -> bool:
    """A ready cluster says Running by itself, and one Kueue holds has no pods;
    otherwise the pods tell what it waits on."""
    return (is_live(_status(job), attempt_of(ray_cluster)) and not held_by_kueue(ray_cluster)
            and (ray_cluster.get("status") or {}).get("state") != RAY_CLUSTER_READY)


def cluster_needs_workload(job: dict[str, Any], ray_cluster: dict[str, Any]) -> bool:
    """Kueue's words are needed while it holds the cluster (why it waits, why it was
    preempted) and once when it admits it (which ClusterQueue)."""
    status = _status(job)
    return (queue_of(ray_cluster) is not None and is_live(status, attempt_of(ray_cluster))
            and (held_by_kueue(ray_cluster) or not admitted(status)))


def pod_needs_cluster(job: dict[str, Any], event: PodChanged) -> bool:
    """A Ray pod of an admitted queued job going away: was its cluster preempted? (Kueue
    suspends the cluster, then KubeRay deletes its pods: the cluster says it first.)"""
    status = _status(job)
    going = event.deleted or bool(event.pod.get("metadata", {}).get("deletionTimestamp"))
    return (going and bool((job.get("spec") or {}).get("queueName"))
            and admitted(status) and is_live(status, attempt_of(event.pod)))
