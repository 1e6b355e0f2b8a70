"""The reconcile function (pure): (job, observed children, event) -> one Action.

KubeRay-style: every handler gathers the job and what the event needs, calls
`reconcile` once and applies the Action. The steps below record what they found
(`status.StatusFacts`); `reconcile` derives the status from those facts once
(`status.derive_status`): one merge patch, written with the resourceVersion it was
decided from and only when it changes something. Facts that must outlive the operator
process (what was counted, when an attempt failed) are read from and written to status
only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from grpo_api.contract import TERMINAL_PHASES, Phase, Reason, Role
from grpo_api.job import SpecError, parse_spec

from ..config import OperatorConfig
from ..render import JobRef, names
from . import model_config
from .action import Action
from .attempts import create_failed, ensure_attempt, finish_attempt, start_next_attempt
from .claims import claim_problem
from .classify import LOST_RANKS, PodOutcome, classify_pod, in_context, worker_outcome
from .conditions import (
    MEMORY_GROWTH,
    RAY_CLUSTER_READY,
    PhaseView,
    attempt_of,
    attempt_phase,
    hub_fetch_conditions,
    memory_growth_conditions,
    role,
    unschedulable,
    unschedulable_view,
)
from .planning import planned_pods
from .progress_deadline import end_silent_attempt
from .queue import (
    admission_event,
    admitted,
    held_by_kueue,
    preempt_attempt,
    preempted,
    queue_of,
    queued_view,
)
from .queue import generation as cluster_generation
from .refusals import pod_create_refusal, refusal_shown, refused
from .retention import claim_change, recreate_advice
from .status import StatusFacts

PREVIOUS_JOB_RETRY_SECONDS = 5.0  # a new job waits this long for an earlier one's pods

# Phases in which the Ray pods and cluster say nothing new: the job ended, is suspended,
# or waits for its next attempt (whose cluster does not exist yet).
_QUIET = (*TERMINAL_PHASES, Phase.SUSPENDED, Phase.RESTARTING)


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
    hub: model_config.HubAnswer | None = None
    model_reader: dict[str, Any] | None = None


def restart_pending(job: dict[str, Any]) -> bool:
    """The restart timer runs only for a job waiting out a backoff, and never for one
    being deleted: deleting a namespace deletes the head pod first, which reads as a
    failure, and the timer would try to start the next attempt where nothing can be
    created any more."""
    meta = job.get("metadata") or {}
    return bool((job.get("status") or {}).get("nextAttempt")) and not meta.get(
        "deletionTimestamp")


def restart_due(job: dict[str, Any], now: str) -> bool:
    """Whether the restart timer's next decision needs the job's pods: once the backoff
    has passed (the next attempt starts only when the earlier ones' pods are gone)."""
    nxt = (job.get("status") or {}).get("nextAttempt") or {}
    return bool(nxt) and now >= str(nxt.get("notBefore") or "")


def pod_matters(event: PodChanged) -> bool:
    """Whether a pod event can change the job: a Ray pod that ended or was deleted while
    it ran (a worker's end ends the attempt too: its ranks are gone), one the scheduler
    cannot place, or a running one (the job may now be Running: noticed from the pods at
    once, not when KubeRay next writes the cluster's status). Pending pods' many other
    events cost no API call."""
    pod = event.pod
    if _ended(pod, event.deleted) is not None:
        return True
    if event.deleted or pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return unschedulable(pod) is not None or pod.get("status", {}).get("phase") == "Running"


def _ended(pod: dict[str, Any], deleted: bool = False) -> PodOutcome | None:
    """How a Ray pod's end ends its attempt, by its role; None while it has not."""
    if role(pod) == Role.HEAD:
        return classify_pod(pod, deleted=deleted)
    return worker_outcome(pod, deleted=deleted)


def pod_needs_pods(job: dict[str, Any], event: PodChanged) -> bool:
    """Whether deciding on this pod event needs the attempt's other pods: a running pod
    of a job not yet Running (Running depends on all its pods), and a head that lost its
    ranks (a worker that ended first tells why: the pod that died decides)."""
    status = job.get("status") or {}
    if (status.get("phase") in _QUIET
            or attempt_of(event.pod) != str(status.get("attempt") or 0)):
        return False
    if role(event.pod) == Role.HEAD:
        ended = classify_pod(event.pod, deleted=event.deleted)
        if ended is not None and ended.reason in LOST_RANKS:
            return True
    return (status.get("phase") != Phase.RUNNING
            and event.pod.get("status", {}).get("phase") == "Running")


def _live(status: dict[str, Any], obj: dict[str, Any]) -> bool:
    """Whether a pod or cluster event can change the job: one of its live attempt, which
    has not ended (a preempted attempt waits for the next one as Queued, not Restarting).
    A job without attempts has none: pods and clusters labelled with its name then are
    an earlier job's of that name, going away."""
    return (status.get("phase") not in _QUIET and not status.get("nextAttempt")
            and bool(status.get("attempts"))
            and attempt_of(obj) == str(status.get("attempt") or 0))


def cluster_needs_pods(job: dict[str, Any], ray_cluster: dict[str, Any]) -> bool:
    """A ready cluster says Running by itself, and one Kueue holds has no pods;
    otherwise the pods tell what it waits on."""
    status = job.get("status") or {}
    return (_live(status, ray_cluster) and not held_by_kueue(ray_cluster)
            and (ray_cluster.get("status") or {}).get("state") != RAY_CLUSTER_READY)


def cluster_needs_workload(job: dict[str, Any], ray_cluster: dict[str, Any]) -> bool:
    """Kueue's words are needed while it holds the cluster (why it waits, why it was
    preempted) and once when it admits it (which ClusterQueue)."""
    status = job.get("status") or {}
    return (queue_of(ray_cluster) is not None and _live(status, ray_cluster)
            and (held_by_kueue(ray_cluster) or not admitted(status)))


def pod_needs_cluster(job: dict[str, Any], event: PodChanged) -> bool:
    """A Ray pod of an admitted queued job going away: was its cluster preempted? (Kueue
    suspends the cluster, then KubeRay deletes its pods: the cluster says it first.)"""
    status = job.get("status") or {}
    going = event.deleted or bool(event.pod.get("metadata", {}).get("deletionTimestamp"))
    return (going and bool((job.get("spec") or {}).get("queueName"))
            and admitted(status) and _live(status, event.pod))


def reconcile(job: dict[str, Any], observed: Observed, event: Event, now: str,
              config: OperatorConfig) -> Action:
    """The one decision for `event` on `job`, with its status patch computed once."""
    meta = job.get("metadata") or {}
    if meta.get("deletionTimestamp") or observed.namespace_terminating:
        return Action()  # going away: owner references take its children with it
    spec = dict(job.get("spec") or {})
    status = dict(job.get("status") or {})
    generation = int(meta.get("generation") or 0)
    ref = JobRef(str(meta.get("name")), str(meta.get("namespace") or "default"),
                 str(meta.get("uid") or ""))
    try:
        return _decide(ref, spec, status, generation, now, observed, event, config).derive(
            status, generation, now)
    except Exception as exc:  # a defect in pure code: never a job without a status
        return _internal_error(event, exc, spec, status).derive(status, generation, now)


def _decide(ref: JobRef, spec: dict[str, Any], status: dict[str, Any], generation: int,
            now: str, observed: Observed, event: Event, config: OperatorConfig) -> Action:
    match event:
        case SpecChanged():
            return _on_spec(ref, spec, status, now, observed, config)
        case BackoffTimer():
            return start_next_attempt(ref, spec, status, now, config.default_image,
                                      config.catalog, observed.pods,
                                      config.previous_attempt_grace_seconds) or Action()
        case ProgressTimer():
            return end_silent_attempt(status, spec, now, config.hang_grace_seconds,
                                      config.catalog)
        case JobChanged():
            return _on_job(status, generation, now)
        case PodChanged(pod=pod, deleted=deleted):
            return _on_pod(ref, spec, status, now, pod, deleted, observed, config)
        case ClusterChanged(ray_cluster=rc):
            return _on_cluster(spec, status, now, rc, observed, config)
        case CreateFailed(kind=kind, name=name, message=message):
            return create_failed(kind, name, message)
    raise TypeError(f"unknown event {event!r}")


def _internal_error(event: Event, exc: Exception, spec: dict[str, Any],
                    status: dict[str, Any]) -> Action:
    """An exception from the operator's own code ends the job Failed with its message,
    once: Kopf would retry the handler forever and the job would never get a status.
    The job's children stay (owner references take them with the job)."""
    if status.get("phase") == Phase.FAILED:
        return Action()
    message = (f"the operator failed deciding on {type(event).__name__}: "
               f"{type(exc).__name__}: {exc}"[:2000]
               + "; this is an operator defect: please report it with this message, and "
               f"after upgrading delete the job and create it again ({recreate_advice(spec)})")
    view = PhaseView(Phase.FAILED, Reason.INTERNAL_ERROR, message)
    return Action(StatusFacts(view), events=[("Warning", Reason.INTERNAL_ERROR, message)])


def _on_spec(ref: JobRef, spec: dict[str, Any], status: dict[str, Any], now: str,
             observed: Observed, config: OperatorConfig) -> Action:
    problem = claim_problem(spec, ref.namespace, observed.claim, observed.model_claim,
                            planned_pods(spec, config.catalog, model_config.recorded(status)))
    if problem:
        return _claim_missing(problem, config)
    earlier = _earlier_jobs_pods(ref, observed.pods)
    if earlier and not status.get("attempts"):
        # A job of this name was deleted and its pods are still going: its drivers must be
        # gone before this job's adopt the checkpoint directory.
        view = PhaseView(Phase.PENDING, Reason.WAITING_FOR_PREVIOUS_JOB,
                         f"{len(earlier)} pod(s) of an earlier job named {ref.name} are still "
                         f"there: {', '.join(earlier[:5])}; this job starts once they are gone")
        return Action(StatusFacts(view), retry=(view.message, PREVIOUS_JOB_RETRY_SECONDS))
    step = _read_model_config(ref, spec, status, observed, now, config)
    if step.waiting is not None:
        wait = step.waiting
        return Action(model_config.waiting_facts(step),
                      children=wait.create, delete_pod=step.delete_pod, events=step.events,
                      retry=(wait.view.message, wait.retry_seconds)
                      if wait.retry_seconds is not None else None)
    if step.fields:  # read now: the plan's pods may need other access modes
        status = {**status, **step.fields}
        problem = claim_problem(spec, ref.namespace, observed.claim, observed.model_claim,
                                planned_pods(spec, config.catalog, model_config.recorded(status)))
        if problem:
            return _with_read(_claim_missing(problem, config), step)
    action = ensure_attempt(ref, spec, status, now, config.default_image, config.catalog)
    if step.fields:
        action = _with_read(action, step)
    action.claim_change = claim_change(spec, ref, observed.claim)
    if action.claim_change is not None and action.claim_change.event is not None:
        action.events.append(action.claim_change.event)
    return action


def _with_read(action: Action, step: model_config.ModelStep) -> Action:
    """`action` with what reading config.json adds: status.modelConfig, its events
    first, and the reader pod to delete."""
    action.facts.record = {**step.fields, **action.facts.record}
    action.events[:0], action.delete_pod = step.events, step.delete_pod
    return action


def _earlier_jobs_pods(ref: JobRef, pods: list[dict[str, Any]]) -> list[str]:
    """The names of pods labelled with this job's name that this job does not own (its
    own model-config reader is labelled so too)."""
    return sorted(str(p.get("metadata", {}).get("name")) for p in pods
                  if not any(o.get("uid") == ref.uid
                             for o in p.get("metadata", {}).get("ownerReferences") or []))


def _claim_missing(problem: str, config: OperatorConfig) -> Action:
    view = PhaseView(Phase.PENDING, Reason.CLAIM_MISSING, problem)
    return Action(StatusFacts(view),
                  events=[("Warning", Reason.CLAIM_MISSING, problem)],
                  retry=(problem, config.claim_retry_seconds))


def _read_model_config(ref: JobRef, spec: dict[str, Any], status: dict[str, Any],
                       observed: Observed, now: str,
                       config: OperatorConfig) -> model_config.ModelStep:
    """Reading config.json, for a new job that needs it (a spec that does not parse is
    refused by ensure_attempt with its reasons)."""
    if model_config.to_read(spec, status) is None:
        return model_config.ModelStep()
    try:
        parsed = parse_spec(spec)
    except SpecError:
        return model_config.ModelStep()
    return model_config.read_step(ref, spec, parsed, status, observed.hub,
                                  observed.model_reader, now, config.default_image)


def _on_job(status: dict[str, Any], generation: int, now: str) -> Action:
    """The trainer's progress report: the MemoryGrowth and HubFetch conditions."""
    grown = memory_growth_conditions(status.get("progress"), status.get("conditions"),
                                     generation, now)
    fetched = hub_fetch_conditions(status.get("progress"), grown or status.get("conditions"),
                                   generation, now)
    new = fetched or grown
    if new is None:
        return Action()
    growth = next((c for c in grown or [] if c["type"] == MEMORY_GROWTH), None)
    events = ([("Warning", Reason.MEMORY_GROWTH, growth["message"])]
              if growth is not None and growth["status"] == "True" else [])
    return Action(StatusFacts(reported=new), events=events)


def _on_pod(ref: JobRef, spec: dict[str, Any], status: dict[str, Any], now: str,
            pod: dict[str, Any], deleted: bool, observed: Observed,
            config: OperatorConfig) -> Action:
    if not _live(status, pod):
        return Action()  # the job is quiet, or a pod of an earlier attempt being removed
    pods = observed.pods
    outcome = _ended(pod, deleted)
    if (outcome is not None and observed.ray_cluster is not None
            and preempted(observed.ray_cluster, status)):
        return preempt_attempt(status, observed.workload, now, recreate_advice(spec))
    if outcome is not None:
        if role(pod) == Role.HEAD and outcome.reason in LOST_RANKS:
            outcome = in_context(outcome, pods)
        claim = names.checkpoint_claim(ref, (spec.get("checkpoint") or {}).get("claimName"))
        return finish_attempt(status, outcome, now, spec, config.catalog, claim)
    view = None if deleted else unschedulable_view(pod)
    if view is None and pods and status.get("phase") != Phase.RUNNING:
        # Its pods exist, so its RayCluster does: the phase follows from the pods.
        view = attempt_phase({}, pods, int((status.get("plan") or {}).get("nodes") or 0))
    if view is not None and view.phase != Phase.RUNNING and refusal_shown(status):
        # A worker still refused: the head's pod events must not hide it (the cluster's
        # events say when KubeRay's refusal goes, and its deadline keeps running).
        return Action()
    return _seen(view, status) if view else Action()


def _seen(view: PhaseView, status: dict[str, Any]) -> Action:
    """The live attempt's phase as seen, and an event when the job starts running."""
    running = view.phase == Phase.RUNNING and status.get("phase") != Phase.RUNNING
    return Action(StatusFacts(view),
                  events=[("Normal", Reason.RUNNING, view.message)] if running else [])


def _on_cluster(spec: dict[str, Any], status: dict[str, Any], now: str, rc: dict[str, Any],
                observed: Observed, config: OperatorConfig) -> Action:
    if not _live(status, rc):
        return Action()
    if preempted(rc, status):
        return preempt_attempt(status, observed.workload, now, recreate_advice(spec))
    if held_by_kueue(rc):
        if admitted(status):
            return Action()  # a copy read before the admission was seen: nothing new
        view = queued_view(rc, observed.workload, observed.cluster_queue)
        queued = status.get("phase") != Phase.QUEUED
        return Action(StatusFacts(view),
                      events=[("Normal", Reason.QUEUED, view.message)] if queued else [])
    action = _observed_cluster(spec, status, now, rc, observed.pods, config)
    if queue_of(rc) is not None and not admitted(status):
        record = action.facts.record
        record["rayCluster"] = {**record.get("rayCluster", {}), "name": rc["metadata"]["name"],
                                "admittedGeneration": cluster_generation(rc)}
        action.events.append(("Normal", Reason.ADMITTED, admission_event(rc, observed.workload)))
    return action


def _observed_cluster(spec: dict[str, Any], status: dict[str, Any], now: str,
                      rc: dict[str, Any], pods: list[dict[str, Any]],
                      config: OperatorConfig) -> Action:
    """The live attempt's cluster as KubeRay reports it: refused pod creates, or the
    phase its state and pods give."""
    refusal = pod_create_refusal(rc)
    if refusal is not None and status.get("phase") != Phase.RUNNING:
        return refused(status, refusal, rc["metadata"]["name"], now,
                       config.pod_create_deadline_seconds, recreate_advice(spec))
    workers = int((status.get("plan") or {}).get("nodes") or 0)
    action = _seen(attempt_phase(rc, pods, workers), status)
    state = (rc.get("status") or {}).get("state")
    if state != (status.get("rayCluster") or {}).get("state"):
        action.facts.record["rayCluster"] = {"name": rc["metadata"]["name"], "state": state}
    return action
