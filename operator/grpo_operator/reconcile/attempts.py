"""An attempt's life (pure): start it, record how it ended, start the next one.

`core.reconcile` calls these; each returns the Action for one event, with what it found
as StatusFacts (the status is derived from them once, in status.py). Planning is in
planning.py (the decision's `Planner`), the claims' checks in claims.py.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from grpo_api.contract import (
    ATTEMPT_RUNNING,
    IMAGE_UID,
    MAX_RESTARTS,
    FailureReason,
    Reason,
)
from grpo_api.job import GRPOJobSpec
from grpo_api.job.status import (
    AttemptRecord,
    GRPOJobStatus,
    NextAttempt,
    ProgressStatus,
    RayClusterStatus,
)

from ..planner import next_safer_plan, plan_status
from ..render import JobRef, names, render_children
from ..render.network_policy import JobNetworkPolicy
from .action import Action
from .classify import PodOutcome
from .conditions import JobEvent, attempt_of, pod_phase
from .model_config import recorded
from .phases import PERMANENT, Finding, attempt_settled, is_suspended, starts_cluster
from .planning import MEMORY_CLASSES, JobPlan, Planner, Refused, backoff_seconds
from .restart_budget import restart_budget, restart_class
from .retention import export_status, recreate_advice
from .status import StatusFacts, StatusRecord
from .stored import reported_step

PER_ATTEMPT_KINDS = ("ConfigMap", "RayCluster")
CREATE_RETRY_SECONDS = 10  # a child the API server refused is tried again this often
_WORDS = {FailureReason.CUDA_OOM: "CUDA OOM", FailureReason.HOST_OOM: "host OOM (pod OOMKilled)",
          FailureReason.WORKERS_MISSING: "worker pods did not all join",
          FailureReason.RAY_OOM: "Ray OOM (memory monitor)",
          FailureReason.NODE_LOST: "node or worker lost",
          FailureReason.HANG: "hang (no progress)",
          FailureReason.TERMINATED: "terminated (SIGTERM)"}


def _time(stamp: str) -> dt.datetime:
    return dt.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _at(now: str, seconds: int) -> str:
    """RFC 3339 with milliseconds: the backoff is honoured to the millisecond."""
    return (_time(now) + dt.timedelta(seconds=seconds)).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


def nodes_to_avoid(attempts: list[AttemptRecord], index: int) -> tuple[str, ...]:
    """The nodes attempt `index`'s pods should keep off (a preference: pod_settings.avoiding):
    the one whose loss ended the attempt before it (its record's `node`). Only that
    attempt's: a node back in service later is preferred like any other again."""
    before = next((a for a in attempts if a.index == index - 1), None)
    return (before.node,) if before is not None and before.node else ()


def current_plan(planner: Planner, status: GRPOJobStatus) -> JobPlan | Refused:
    """The live attempt's plan: the remediations of the attempts before it replayed
    (planning.planned), with config.json as status.modelConfig holds it."""
    before = [a for a in status.attempts if a.index != status.attempt]
    return planner.plan(before, recorded(status))


def ensure_attempt(job: JobRef, planned: JobPlan | Refused, status: GRPOJobStatus,
                   now: str, default_image: str = "",
                   pod_uid: int | None = IMAGE_UID,
                   network_policy: JobNetworkPolicy | None = None) -> Action:
    """Children and status of the current attempt, on create/resume/spec change;
    `planned`: its plan (current_plan), or why there is none; `pod_uid`: the Ray pods'
    UID (OperatorConfig.trainer_pod_uid); `network_policy`: the platform's, for the
    job's pods (OperatorConfig.job_network_policy)."""
    if attempt_settled(status):
        return Action()  # done, or the restart timer owns the next step
    bad_name = names.job_name_problem(job.name)  # the CRD refuses these; older CRDs did not
    if bad_name:
        return Action(StatusFacts(Finding(Reason.INVALID_NAME, bad_name)),
                      events=[("Warning", Reason.INVALID_NAME, bad_name)])
    if isinstance(planned, Refused):
        why = str(planned.error)
        return Action(StatusFacts(Finding(planned.reason, why)),
                      events=[("Warning", planned.reason, why)])
    spec, plan = planned.spec, planned.plan
    attempt = status.attempt or 0
    rc_name = names.ray_cluster(job, attempt)
    if spec.suspend:
        found = Finding(Reason.SUSPENDED_BY_USER,
                        "spec.suspend is true: Ray pods released, checkpoints and status kept")
        return Action(
            StatusFacts(found),
            delete_ray_cluster=rc_name,
            events=[("Normal", Reason.SUSPENDED, found.message)],
        )
    saved = _measured_save_s(status)
    children = render_children(spec, plan, job, attempt, default_image,
                               measured_save_s=saved, pod_uid=pod_uid,
                               network_policy=network_policy,
                               avoid_nodes=nodes_to_avoid(status.attempts, attempt))
    fields: StatusRecord = {"attempt": attempt,
                            "ray_cluster": RayClusterStatus.model_validate({"name": rc_name})}
    events: list[JobEvent] = []
    if not any(a.index == attempt for a in status.attempts):
        fields |= {"attempts": [*status.attempts, _started(job, spec, attempt, now)],
                   "plan": plan_status(plan, saved, planned.inherited).to_wire(),
                   "restarts": status.restarts}
        settings = plan.settings
        micro = (f"{settings.micro_batch_tokens} tokens" if settings.micro_batch_tokens
                 else str(settings.micro_batch_size))
        events.append(("Normal", Reason.PLANNED,
                       f"{plan.world_size} x {plan.geometry.gpu}; gradient checkpointing "
                       f"{settings.gradient_checkpointing}, offload params "
                       f"{settings.offload_params}, offload optimizer "
                       f"{settings.offload_optimizer}, micro-batch {micro}; "
                       f"peak {plan.budget.peak_gpu_gib:.1f} GiB/GPU, "
                       f"{plan.budget.peak_host_gib:.0f} GiB host/node; model shape from "
                       f"{plan.geometry.shape_source}"))
    # A live attempt's phase follows its pods and cluster, not the spec.
    start: Finding | None = None
    if starts_cluster(status):
        start = Finding(Reason.CREATING_CLUSTER, f"creating RayCluster {rc_name}")
        # A new cluster: no state yet, and not admitted by Kueue yet.
        fields["ray_cluster"] = _new_cluster(rc_name)
        if is_suspended(status):
            events.append(("Normal", Reason.RESUMED, f"resuming attempt {attempt} from its "
                           "newest complete checkpoint"))
    return Action(StatusFacts(start, record=fields), children=children,
                  events=events)


def create_failed(kind: str, name: str, api_message: str) -> Action:
    """The API server refused a child: show it where users look (phase Pending, Degraded
    and Progressing with reason CreateFailed, a Warning event), with the server's own
    message, instead of a silent CreatingCluster; the handler retries the create."""
    found = Finding(Reason.CREATE_FAILED, f"creating {kind} {name} failed: {api_message} "
                    f"(retrying every {CREATE_RETRY_SECONDS} s)")
    return Action(
        StatusFacts(found),
        events=[("Warning", Reason.CREATE_FAILED, found.message)],
        retry=(found.message, CREATE_RETRY_SECONDS))


def _new_cluster(name: str) -> RayClusterStatus:
    """status.rayCluster of a cluster about to be created: no state yet, and not admitted
    by Kueue yet (the earlier cluster's are removed)."""
    return RayClusterStatus.model_validate(
        {"name": name, "state": None, "admitted_generation": None})


def _started(job: JobRef, spec: GRPOJobSpec, index: int, now: str,
             resumed_from_step: int | None = None) -> AttemptRecord:
    """The record of attempt `index`, starting now (resuming from that checkpoint step),
    with where its pods keep their logs."""
    resumed = {"resumed_from_step": resumed_from_step} if resumed_from_step is not None else {}
    logs = names.attempt_logs(job, index, spec.checkpoint)
    return AttemptRecord.model_validate(
        {"index": index, "start_time": now, "outcome": ATTEMPT_RUNNING, "logs": logs,
         **resumed})


def _cluster_name(status: GRPOJobStatus) -> str | None:
    return status.ray_cluster.name if status.ray_cluster is not None else None


def finish_attempt(status: GRPOJobStatus, outcome: PodOutcome, now: str,
                   planner: Planner | None = None, claim: str | None = None) -> Action:
    """The head's trainer ended: record the attempt, then succeed (with the exported
    model's place on the checkpoint `claim` in status.export), restart (after a
    backoff, with the next safer setting for its failure class, planned by `planner`;
    None: not retried) or give up."""
    attempt = status.attempt or 0
    live = next((a for a in status.attempts if a.index == attempt), None)
    if live is None or live.outcome != ATTEMPT_RUNNING:
        return Action()  # already recorded (several pod events report it)
    progress = status.progress
    step = outcome.step if outcome.step is not None else reported_step(progress)
    ckpt = outcome.last_checkpoint_step
    if ckpt is None and progress is not None:
        ckpt = progress.last_checkpoint_step
    ended: dict[str, Any] = {"end_time": now, "outcome": outcome.reason.value,
                             "reason": outcome.message, "step": step,
                             "last_checkpoint_step": ckpt,
                             "failed_stage": outcome.failed_during, "failed_side": outcome.side}
    if outcome.node and restart_class(outcome.reason.value) == "nodeLost":
        ended["node"] = outcome.node
    # Only what is known is recorded: a field left out keeps what the record had.
    record = live.model_copy(update={k: v for k, v in ended.items() if v is not None})
    attempts = [record if a is live else a for a in status.attempts]
    rc = _cluster_name(status)
    reason = outcome.reason
    if reason is FailureReason.SUCCEEDED:
        exported: StatusRecord = ({"export": export_status(outcome.export, claim)}
                                  if outcome.export is not None else {})
        return _ended(attempts, Finding(Reason.TRAINING_FINISHED,
                                        f"attempt {attempt}: {outcome.message}"),
                      rc, "Normal", exported)
    restarts = status.restarts
    what = _WORDS.get(reason, reason.value)
    where = f" at step {step}" if step is not None else ""
    last = next((a.remediation for a in reversed(attempts[:-1]) if a.remediation), None)
    if reason in PERMANENT or planner is None:
        advice = recreate_advice(planner.spec if planner is not None else None)
        return _ended(attempts, Finding(
            Reason(reason), f"attempt {attempt}: {outcome.message}; not retried: fix the "
            f"cause, then delete the job and create it again ({advice})", final=True),
            rc, "Warning")
    planned = planner.plan(attempts[:-1], recorded(status))
    if isinstance(planned, Refused):
        raise planned.error  # as an admitted job's spec does not: an operator defect
    spec, plan = planned.spec, planned.plan
    budget = restart_budget(spec, reason, attempts[:-1], restarts)
    if budget.spent or restarts >= MAX_RESTARTS:
        return _ended(attempts, Finding(
            Reason(reason), f"{what}{where} after {restarts} restarts{budget.words()}; last "
            f"setting tried: {last or 'the planned settings'}", final=True), rc, "Warning")
    remediation = None
    if spec.recovery.remediate and reason in MEMORY_CLASSES:
        safer = next_safer_plan(plan, reason, stage=outcome.failed_during,
                                side=outcome.side)
        if safer is None:
            return _ended(attempts, Finding(
                Reason(reason), f"{what}{where} after {restarts} restarts; every safer "
                f"setting for {reason.value} was tried; last: "
                f"{last or 'the planned settings'}", final=True), rc, "Warning")
        remediation = safer.remediations[-1]
        remediated = record.model_copy(update={"remediation": remediation})
        attempts = [remediated if a is record else a for a in attempts]
    wait = backoff_seconds(spec, restarts)
    change = remediation or "the same settings (no memory ladder for this failure)"
    if reason is FailureReason.HANG:
        change += " and the collective debug env (NCCL flight recorder)"
    found = Finding(Reason(reason), f"attempt {attempt}: {what}{where}; attempt {attempt + 1} "
                    f"in {wait} s with {change}, resuming from checkpoint step {ckpt or 0}")
    return Action(
        StatusFacts(found, record={
            "attempts": attempts, "restarts": restarts + 1,
            "next_attempt": NextAttempt(index=attempt + 1, not_before=_at(now, wait))}),
        delete_ray_cluster=rc,
        events=[("Warning", Reason(reason), found.message)],
        restart_reason=reason.value,
    )


def _ended(attempts: list[AttemptRecord], found: Finding, rc: str | None, kind: str,
           fields: StatusRecord | None = None) -> Action:
    return Action(
        StatusFacts(found, record={"attempts": attempts, **(fields or {})}),
        delete_ray_cluster=rc,
        events=[(kind, Reason(found.reason), found.message)],
    )


def start_next_attempt(job: JobRef, planner: Planner, status: GRPOJobStatus, now: str,
                       default_image: str = "", pods: list[dict[str, Any]] | None = None,
                       grace_seconds: float = 120.0,
                       pod_uid: int | None = IMAGE_UID) -> Action | None:
    """After the backoff, once the earlier attempts' pods are gone: the next attempt's
    children with the remediated plan. None while the backoff has not passed."""
    nxt = status.next_attempt
    if nxt is None or _time(now) < _time(nxt.not_before):
        return None
    index = nxt.index
    lingering = sorted(str(p.get("metadata", {}).get("name")) for p in pods or []
                       if attempt_of(p) != str(index)
                       and pod_phase(p) not in ("Succeeded", "Failed"))
    waited = (_time(now) - _time(nxt.not_before)).total_seconds()
    if lingering and waited < grace_seconds:
        # Two drivers of one job must never overlap on its checkpoints.
        return Action(StatusFacts(Finding(
            Reason.WAITING_FOR_PREVIOUS_ATTEMPT,
            f"attempt {index} starts once {len(lingering)} pod(s) of earlier attempts are "
            f"gone: {', '.join(lingering[:5])} (at most {grace_seconds:g} s more)")))
    action = _next_attempt(job, planner, status, index, now, default_image, pod_uid)
    if lingering:
        action.events.append(("Warning", Reason.PREVIOUS_ATTEMPT_LINGERS,
                               f"started attempt {index} although {', '.join(lingering[:5])} "
                               f"still exist after {waited:.0f} s (a lost node?); an older "
                               "driver cannot commit a checkpoint once a newer attempt exists"))
    return action


def _next_attempt(job: JobRef, planner: Planner, status: GRPOJobStatus, index: int,
                  now: str, default_image: str, pod_uid: int | None) -> Action:
    """Attempt `index` (status.nextAttempt's) started: its record and children."""
    planned = planner.plan(status.attempts, recorded(status))
    if isinstance(planned, Refused):
        raise planned.error  # as an admitted job's spec does not: an operator defect
    spec, plan = planned.spec, planned.plan
    attempts, resumed = _newest_checkpoint(status.attempts, status.progress)
    rc = names.ray_cluster(job, index)
    saved = _measured_save_s(status)
    found = Finding(Reason.CREATING_CLUSTER, f"attempt {index}: creating RayCluster {rc}, "
                    f"resuming from checkpoint step {resumed or 0}")
    return Action(
        StatusFacts(found, record={
            "attempt": index, "attempts": [*attempts, _started(job, spec, index, now, resumed)],
            "next_attempt": None,
            "ray_cluster": _new_cluster(rc),
            "plan": plan_status(plan, saved, planned.inherited).to_wire()}),
        # Only what is new per attempt: the claim and the trainer's RBAC exist since
        # attempt 0 (and reconcile re-ensures them), so a restart skips four creates.
        children=[c for c in render_children(spec, plan, job, index, default_image,
                                             debug_collectives=_after_hang(attempts),
                                             measured_save_s=saved, pod_uid=pod_uid,
                                             avoid_nodes=nodes_to_avoid(attempts, index))
                  if c["kind"] in PER_ATTEMPT_KINDS],
        events=[("Normal", Reason.RESTARTED, found.message)],
        recovered_after=failed_for(attempts, now),
    )


def _measured_save_s(status: GRPOJobStatus) -> float | None:
    """The newest save's measured seconds (any attempt's: the same plan writes the same
    bytes, a remediated one rarely many more), None before the first save."""
    saved = status.progress.save_seconds if status.progress is not None else None
    return float(saved) if saved is not None and saved > 0 else None


def _after_hang(attempts: list[AttemptRecord]) -> bool:
    """Whether the attempt that ended last hung: the next one (only) gets the collective
    debug env, to say where a collective is stuck if it hangs again."""
    return bool(attempts) and attempts[-1].outcome == FailureReason.HANG.value


def _newest_checkpoint(attempts: list[AttemptRecord], progress: ProgressStatus | None
                       ) -> tuple[list[AttemptRecord], int | None]:
    """(the attempts, the step the next attempt resumes from). The ended attempt's record
    may lag: its trainer can commit (and report) a checkpoint after the operator recorded
    the end, e.g. while KubeRay is still deleting a preempted cluster's pods. The next
    attempt starts only once those pods are gone, so the last report is final by now;
    the ended attempt's record is brought up to it."""
    recorded = next((a.last_checkpoint_step for a in reversed(attempts)
                     if a.last_checkpoint_step is not None), None)
    reported = progress.last_checkpoint_step if progress is not None else None
    if reported is not None and (recorded is None or reported > recorded):
        if attempts:
            last = attempts[-1].model_copy(update={"last_checkpoint_step": reported})
            attempts = [*attempts[:-1], last]
        return attempts, reported
    return attempts, recorded


def failed_for(attempts: list[AttemptRecord], now: str) -> float | None:
    """Seconds since the last attempt ended (from status, so an operator restart during
    the backoff keeps the figure)."""
    ended = attempts[-1].end_time if attempts else None
    return (_time(now) - _time(ended)).total_seconds() if ended else None
