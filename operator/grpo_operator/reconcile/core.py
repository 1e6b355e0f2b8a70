"""The reconcile function (pure): (job, observed children, event) -> one Action.

KubeRay-style: every handler gathers the job and what the event needs (observe.py),
calls `reconcile` once and applies the Action. `reconcile` reads the stored status once
into the API's typed GRPOJobStatus (stored.read_status), parses the spec once and
hands it down with a `planning.Planner`, which plans only for a step that needs a plan
(at most once a decision). The steps below record what they found
(`status.StatusFacts`: a `phases.Finding`, the record); `reconcile` derives the status
from those facts once (`status.derive_status`): one merge patch, written with the
resourceVersion it was decided from and only when it changes something. Facts that
must outlive the operator process (what was counted, when an attempt failed) are read
from and written to status only.
"""

from __future__ import annotations

from typing import Any

from grpo_api.contract import ConditionType, Reason, Role
from grpo_api.job import GRPOJobSpec, SpecError
from grpo_api.job.status import Condition, GRPOJobStatus, RayClusterStatus

from ..config import OperatorConfig
from ..hub_endpoints import with_endpoint_url
from ..job_defaults import recorded_origins, with_job_defaults
from ..node_shapes import catalog_with_nodes
from ..render import JobRef, names
from . import model_config, observe
from .action import Action
from .attempts import (
    create_failed,
    current_plan,
    ensure_attempt,
    finish_attempt,
    start_next_attempt,
)
from .claims import claim_problem
from .classify import LOST_RANKS, in_context
from .conditions import (
    CHECKPOINT_UPLOAD,
    FABRIC_FALLBACK,
    MEMORY_GROWTH,
    MEMORY_PLAN,
    attempt_of,
    checkpoint_upload_conditions,
    cluster_finding,
    fabric_conditions,
    hub_fetch_conditions,
    memory_growth_conditions,
    memory_plan_conditions,
    role,
    unschedulable_finding,
    workers_expected,
)
from .observe import Event, Observed, ended
from .phases import Finding, has_failed, is_live, is_queued, is_running
from .planning import JobPlan, Planner, Refused
from .progress_deadline import end_silent_attempt
from .queue import (
    admission_event,
    admitted,
    held_by_kueue,
    preempt_attempt,
    preempted,
    queue_of,
    queued_finding,
)
from .queue import generation as cluster_generation
from .refusals import pod_create_refusal, refusal_shown, refused
from .retention import claim_change, recreate_advice
from .status import StatusFacts
from .stored import read_status

PREVIOUS_JOB_RETRY_SECONDS = 5.0  # a new job waits this long for an earlier one's pods


def reconcile(job: dict[str, Any], observed: Observed, event: Event, now: str,
              config: OperatorConfig) -> Action:
    """The one decision for `event` on `job`, with its status patch computed once."""
    meta = job.get("metadata") or {}
    if meta.get("deletionTimestamp") or observed.namespace_terminating:
        return Action()  # going away: owner references take its children with it
    raw_spec = dict(job.get("spec") or {})
    stored = read_status(job.get("status"))  # read once: every step reads this
    status = stored.status
    generation = int(meta.get("generation") or 0)
    ref = JobRef(str(meta.get("name")), str(meta.get("namespace") or "default"),
                 str(meta.get("uid") or ""))
    # The platform's defaults where the job sets nothing (job_defaults.py); those it
    # recorded at creation (image, queue) are the job's fields now, named by annotation.
    defaults = with_job_defaults(raw_spec, config.job_defaults, ref.namespace)
    raw_spec = defaults.raw_spec
    inherited = recorded_origins(meta.get("annotations") or {}) | defaults.origins
    catalog = catalog_with_nodes(config.catalog, observed.nodes)  # the Nodes as they are
    try:  # a hub by the name the platform gave it: its URL from here on
        raw_spec = with_endpoint_url(raw_spec, config.hub_endpoints)
        planner = Planner(raw_spec, catalog, inherited=inherited)  # parsed once
    except SpecError as exc:
        planner = Planner(raw_spec, catalog, refused=exc)
    if stored.unreadable is not None:
        # A stored field that does not read (what the steps would trip over): said as a
        # defect would be; the fields stay as stored (nothing decided writes them).
        action = _internal_error(event, stored.unreadable, planner.spec, status)
    else:
        try:
            action = _decide(ref, raw_spec, planner, status, generation, now, observed,
                             event, config)
        except Exception as exc:  # a defect in pure code: never a job without a status
            action = _internal_error(event, exc, planner.spec, status)
    action.plans = planner.runs
    return action.derive(stored, generation, now)


def _decide(ref: JobRef, raw_spec: dict[str, Any], planner: Planner, status: GRPOJobStatus,
            generation: int, now: str, observed: Observed, event: Event,
            config: OperatorConfig) -> Action:
    match event:
        case observe.SpecChanged():
            return _on_spec(ref, raw_spec, planner, status, now, observed, config)
        case observe.BackoffTimer():
            return start_next_attempt(ref, planner, status, now, config.default_image,
                                      observed.pods,
                                      config.previous_attempt_grace_seconds,
                                      config.trainer_pod_uid) or Action()
        case observe.ProgressTimer():
            return end_silent_attempt(status, planner, now, config.hang_grace_seconds)
        case observe.JobChanged():
            return _on_job(status, generation, now)
        case observe.PodChanged(pod=pod, deleted=deleted):
            return _on_pod(ref, planner, status, now, pod, deleted, observed)
        case observe.ClusterChanged(ray_cluster=rc):
            return _on_cluster(planner.spec, status, now, rc, observed, config)
        case observe.CreateFailed(kind=kind, name=name, message=message):
            return create_failed(kind, name, message)
    raise TypeError(f"unknown event {event!r}")


def _internal_error(event: Event, exc: Exception, spec: GRPOJobSpec | None,
                    status: GRPOJobStatus) -> Action:
    """An exception from the operator's own code ends the job Failed with its message,
    once: Kopf would retry the handler forever and the job would never get a status.
    The job's children stay (owner references take them with the job)."""
    if has_failed(status):
        return Action()
    message = (f"the operator failed deciding on {type(event).__name__}: "
               f"{type(exc).__name__}: {exc}"[:2000]
               + "; this is an operator defect: please report it with this message, and "
               f"after upgrading delete the job and create it again ({recreate_advice(spec)})")
    return Action(StatusFacts(Finding(Reason.INTERNAL_ERROR, message)),
                  events=[("Warning", Reason.INTERNAL_ERROR, message)])


def _on_spec(ref: JobRef, raw_spec: dict[str, Any], planner: Planner, status: GRPOJobStatus,
             now: str, observed: Observed, config: OperatorConfig) -> Action:
    """A new, edited or resumed job: config.json read (once, for a new job that needs
    it), the plan made once with it, the claims checked against the plan's pods, then
    the current attempt ensured."""
    step = _read_model_config(ref, raw_spec, planner.spec, status, observed, now, config)
    # With config.json as read now: the plan's pods may need other access modes.
    read = status.model_copy(update=dict(step.fields))
    planned = current_plan(planner, read)
    problem = _claims_problem(ref, planner.spec, planned, observed)
    if problem:
        # The read is not kept: it is done again once the claims can serve the job.
        return _claim_missing(problem, config)
    earlier = _earlier_jobs_pods(ref, observed.pods)
    if earlier and not status.attempts:
        # A job of this name was deleted and its pods are still going: its drivers must be
        # gone before this job's adopt the checkpoint directory.
        found = Finding(Reason.WAITING_FOR_PREVIOUS_JOB,
                        f"{len(earlier)} pod(s) of an earlier job named {ref.name} are still "
                        f"there: {', '.join(earlier[:5])}; this job starts once they are gone")
        return Action(StatusFacts(found), retry=(found.message, PREVIOUS_JOB_RETRY_SECONDS))
    if step.waiting is not None:
        wait = step.waiting
        return Action(model_config.waiting_facts(step),
                      children=wait.create, delete_pod=step.delete_pod, events=step.events,
                      retry=(wait.found.message, wait.retry_seconds)
                      if wait.retry_seconds is not None else None)
    action = ensure_attempt(ref, planned, read, now, config.default_image,
                            config.trainer_pod_uid, config.job_network_policy)
    if step.fields:
        action = _with_read(action, step)
    if planner.spec is not None:
        action.claim_change = claim_change(planner.spec, ref, observed.claim)
    if action.claim_change is not None and action.claim_change.event is not None:
        action.events.append(action.claim_change.event)
    return action


def _claims_problem(ref: JobRef, spec: GRPOJobSpec | None, planned: JobPlan | Refused,
                    observed: Observed) -> str | None:
    """Why the claims the spec names cannot serve the plan's pods (one pod when there is
    no plan: ensure_attempt then refuses the job with the reason)."""
    if spec is None:
        return None  # a spec that does not parse names no claim: ensure_attempt refuses it
    pods = planned.plan.pods if isinstance(planned, JobPlan) else 1
    return claim_problem(spec, ref.namespace, observed.claim, observed.model_claim, pods)


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
    return Action(StatusFacts(Finding(Reason.CLAIM_MISSING, problem)),
                  events=[("Warning", Reason.CLAIM_MISSING, problem)],
                  retry=(problem, config.claim_retry_seconds))


def _read_model_config(ref: JobRef, raw_spec: dict[str, Any], spec: GRPOJobSpec | None,
                       status: GRPOJobStatus, observed: Observed, now: str,
                       config: OperatorConfig) -> model_config.ModelStep:
    """Reading config.json, for a new job that needs it (a spec that does not parse is
    refused by ensure_attempt with its reasons)."""
    if spec is None or model_config.to_read(raw_spec, status) is None:
        return model_config.ModelStep()
    return model_config.read_step(ref, raw_spec, spec, status, observed.hub,
                                  observed.model_reader, now, config.default_image,
                                  config.trainer_pod_uid)


def _on_job(status: GRPOJobStatus, generation: int, now: str) -> Action:
    """The trainer's progress report: the MemoryGrowth, HubFetch, FabricFallback,
    MemoryPlan and CheckpointUpload conditions."""
    progress = status.progress
    grown = memory_growth_conditions(progress, status.conditions, generation, now)
    fetched = hub_fetch_conditions(progress, grown or status.conditions, generation, now)
    fabric = fabric_conditions(progress, status.plan, fetched or grown or status.conditions,
                               generation, now)
    before = fabric or fetched or grown or status.conditions
    planned = memory_plan_conditions(progress, status.plan, status.attempt, before,
                                     generation, now)
    uploaded = checkpoint_upload_conditions(progress, planned or before, generation, now)
    new = uploaded or planned or fabric or fetched or grown
    if new is None:
        return Action()
    growth = next((c for c in grown or [] if c.type == MEMORY_GROWTH), None)
    events = ([("Warning", Reason.MEMORY_GROWTH, growth.message)]
              if growth is not None and growth.status == "True" else [])
    fell = next((c for c in fabric or [] if c.type == FABRIC_FALLBACK), None)
    if fell is not None and fell.status == "True":
        events.append(("Warning", Reason.SOCKET_FALLBACK, fell.message))
    if _turned(planned, status.conditions, MEMORY_PLAN, Reason.UNDERESTIMATED):
        under = next(c for c in planned or [] if c.type == MEMORY_PLAN)
        events.append(("Warning", Reason.UNDERESTIMATED, under.message))
    if _turned(uploaded, status.conditions, CHECKPOINT_UPLOAD, Reason.UPLOAD_RETRYING):
        retrying = next(c for c in uploaded or [] if c.type == CHECKPOINT_UPLOAD)
        events.append(("Warning", Reason.UPLOAD_RETRYING, retrying.message))
    return Action(StatusFacts(reported=new), events=events)


def _turned(new: list[Condition] | None, old: list[Condition], kind: ConditionType,
            reason: Reason) -> bool:
    """Whether the condition of `kind` has just taken `reason` (an event once, not at
    every change of its message)."""
    now = next((c for c in new or [] if c.type == kind), None)
    was = next((c for c in old if c.type == kind), None)
    return now is not None and now.reason == reason and (was is None or was.reason != reason)


def _on_pod(ref: JobRef, planner: Planner, status: GRPOJobStatus, now: str,
            pod: dict[str, Any], deleted: bool, observed: Observed) -> Action:
    if not is_live(status, attempt_of(pod)):
        return Action()  # the job is quiet, or a pod of an earlier attempt being removed
    pods = observed.pods
    outcome = ended(pod, deleted)
    if (outcome is not None and observed.ray_cluster is not None
            and preempted(observed.ray_cluster, status)):
        return preempt_attempt(status, observed.workload, now, recreate_advice(planner.spec))
    if outcome is not None:
        if role(pod) == Role.HEAD and outcome.reason in LOST_RANKS:
            outcome = in_context(outcome, pods)
        claim = (names.job_claim(ref, planner.spec.checkpoint) if planner.spec is not None
                 else names.checkpoint_claim(ref, None))
        return finish_attempt(status, outcome, now, planner, claim)
    found = None if deleted else unschedulable_finding(pod)
    if found is None and pods and not is_running(status):
        # Its pods exist, so its RayCluster does: how far it is follows from the pods.
        found = cluster_finding({}, pods, workers_expected(status.plan))
    if found is not None and found.reason != Reason.CLUSTER_RUNNING and refusal_shown(status):
        # A worker still refused: the head's pod events must not hide it (the cluster's
        # events say when KubeRay's refusal goes, and its deadline keeps running).
        return Action()
    return _seen(found, status) if found else Action()


def _seen(found: Finding, status: GRPOJobStatus) -> Action:
    """How far the live attempt is, as seen, and an event when the job starts running."""
    starts = found.reason == Reason.CLUSTER_RUNNING and not is_running(status)
    return Action(StatusFacts(found),
                  events=[("Normal", Reason.RUNNING, found.message)] if starts else [])


def _on_cluster(spec: GRPOJobSpec | None, status: GRPOJobStatus, now: str,
                rc: dict[str, Any], observed: Observed, config: OperatorConfig) -> Action:
    if not is_live(status, attempt_of(rc)):
        return Action()
    if preempted(rc, status):
        return preempt_attempt(status, observed.workload, now, recreate_advice(spec))
    if held_by_kueue(rc):
        if admitted(status):
            return Action()  # a copy read before the admission was seen: nothing new
        found = queued_finding(rc, observed.workload, observed.cluster_queue)
        queued = not is_queued(status)
        return Action(StatusFacts(found),
                      events=[("Normal", Reason.QUEUED, found.message)] if queued else [])
    action = _observed_cluster(spec, status, now, rc, observed.pods, config)
    if queue_of(rc) is not None and not admitted(status):
        record = action.facts.record
        admitted_now = {"name": rc["metadata"]["name"],
                        "admitted_generation": cluster_generation(rc)}
        seen = record.get("ray_cluster")
        record["ray_cluster"] = (seen.model_copy(update=admitted_now) if seen is not None
                                 else RayClusterStatus.model_validate(admitted_now))
        action.events.append(("Normal", Reason.ADMITTED, admission_event(rc, observed.workload)))
    return action


def _observed_cluster(spec: GRPOJobSpec | None, status: GRPOJobStatus, now: str,
                      rc: dict[str, Any], pods: list[dict[str, Any]],
                      config: OperatorConfig) -> Action:
    """The live attempt's cluster as KubeRay reports it: refused pod creates, or how far
    its state and pods are."""
    refusal = pod_create_refusal(rc)
    if refusal is not None and not is_running(status):
        return refused(status, refusal, rc["metadata"]["name"], now,
                       config.pod_create_deadline_seconds, recreate_advice(spec))
    action = _seen(cluster_finding(rc, pods, workers_expected(status.plan)), status)
    state = (rc.get("status") or {}).get("state")
    if state != (status.ray_cluster.state if status.ray_cluster is not None else None):
        action.facts.record["ray_cluster"] = RayClusterStatus.model_validate(
            {"name": rc["metadata"]["name"], "state": state})
    return action
