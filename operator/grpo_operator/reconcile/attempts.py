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
    TERMINAL_PHASES,
    FailureReason,
    Phase,
    Reason,
)

from ..planner import next_safer_plan, plan_status
from ..render import JobRef, names, render_children
from ..render.network_policy import JobNetworkPolicy
from .action import Action
from .classify import PodOutcome
from .conditions import JobEvent, attempt_of, pod_phase
from .model_config import recorded
from .phases import PERMANENT, Finding
from .planning import MEMORY_CLASSES, JobPlan, Planner, Refused, backoff_seconds
from .restart_budget import restart_budget, restart_class
from .retention import export_status, recreate_advice
from .status import StatusFacts

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




def nodes_to_avoid(attempts: list[dict[str, Any]], index: int) -> tuple[str, ...]:
    """The nodes attempt `index`'s pods should keep off (a preference: pod_settings.avoiding):
    the one whose loss ended the attempt before it (its record's `node`). Only that
    attempt's: a node back in service later is preferred like any other again."""
    before = next((a for a in attempts if a.get("index") == index - 1), None)
    node = (before or {}).get("node")
    return (str(node),) if node else ()


def current_plan(planner: Planner, status: dict[str, Any]) -> JobPlan | Refused:
    """The live attempt's plan: the remediations of the attempts before it replayed
    (planning.planned), with config.json as status.modelConfig holds it."""
    before = [a for a in status.get("attempts") or [] if a.get("index") != status.get("attempt")]
    return planner.plan(before, recorded(status))


def ensure_attempt(job: JobRef, planned: JobPlan | Refused, status: dict[str, Any],
                   now: str, default_image: str = "",
                   pod_uid: int | None = IMAGE_UID,
                   network_policy: JobNetworkPolicy | None = None) -> Action:
    """Children and status of the current attempt, on create/resume/spec change;
    `planned`: its plan (current_plan), or why there is none; `pod_uid`: the Ray pods'
    UID (OperatorConfig.trainer_pod_uid); `network_policy`: the platform's, for the
    job's pods (OperatorConfig.job_network_policy)."""
    if status.get("phase") in TERMINAL_PHASES or status.get("nextAttempt"):
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
    attempt = int(status.get("attempt") or 0)
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
                               avoid_nodes=nodes_to_avoid(status.get("attempts") or [], attempt))
    attempts = list(status.get("attempts") or [])
    fields: dict[str, Any] = {"attempt": attempt, "rayCluster": {"name": rc_name}}
    events: list[JobEvent] = []
    if not any(a.get("index") == attempt for a in attempts):
        attempts.append({"index": attempt, "startTime": now, "outcome": ATTEMPT_RUNNING})
        fields |= {"attempts": attempts,
                   "plan": plan_status(plan, saved, planned.inherited).to_wire(),
                   "restarts": int(status.get("restarts") or 0)}
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
    if status.get("phase") in (None, Phase.SUSPENDED):
        start = Finding(Reason.CREATING_CLUSTER, f"creating RayCluster {rc_name}")
        # A new cluster: no state yet, and not admitted by Kueue yet.
        fields["rayCluster"] = {"name": rc_name, "state": None, "admittedGeneration": None}
        if status.get("phase") == Phase.SUSPENDED:
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


def finish_attempt(status: dict[str, Any], outcome: PodOutcome, now: str,
                   planner: Planner | None = None, claim: str | None = None) -> Action:
    """The head's trainer ended: record the attempt, then succeed (with the exported
    model's place on the checkpoint `claim` in status.export), restart (after a
    backoff, with the next safer setting for its failure class, planned by `planner`;
    None: not retried) or give up."""
    attempt = int(status.get("attempt") or 0)
    attempts = [dict(a) for a in status.get("attempts") or []]
    record = next((a for a in attempts if a.get("index") == attempt), None)
    if record is None or record.get("outcome") != ATTEMPT_RUNNING:
        return Action()  # already recorded (several pod events report it)
    progress = status.get("progress") or {}
    record.update(endTime=now, outcome=outcome.reason.value, reason=outcome.message)
    step = outcome.step if outcome.step is not None else progress.get("step")
    if step is not None:
        record["step"] = step
    ckpt = outcome.last_checkpoint_step
    if ckpt is None:
        ckpt = progress.get("lastCheckpointStep")
    if ckpt is not None:
        record["lastCheckpointStep"] = ckpt
    if outcome.failed_during is not None:
        record["failedPhase"] = outcome.failed_during.value
    if outcome.side is not None:
        record["failedSide"] = outcome.side
    if outcome.node and restart_class(outcome.reason.value) == "nodeLost":
        record["node"] = outcome.node
    rc = (status.get("rayCluster") or {}).get("name")
    reason = outcome.reason
    if reason is FailureReason.SUCCEEDED:
        exported = ({"export": export_status(outcome.export, claim)}
                    if outcome.export is not None and claim else {})
        return _ended(attempts, Finding(Reason.TRAINING_FINISHED,
                                        f"attempt {attempt}: {outcome.message}"),
                      rc, "Normal", **exported)
    restarts = int(status.get("restarts") or 0)
    what = _WORDS.get(reason, reason.value)
    where = f" at step {step}" if step is not None else ""
    last = next((a["remediation"] for a in reversed(attempts[:-1]) if a.get("remediation")),
                None)
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
        safer = next_safer_plan(plan, reason, phase=outcome.failed_during,
                                side=outcome.side)
        if safer is None:
            return _ended(attempts, Finding(
                Reason(reason), f"{what}{where} after {restarts} restarts; every safer "
                f"setting for {reason.value} was tried; last: "
                f"{last or 'the planned settings'}", final=True), rc, "Warning")
        remediation = safer.remediations[-1]
        record["remediation"] = remediation
    wait = backoff_seconds(spec, restarts)
    change = remediation or "the same settings (no memory ladder for this failure)"
    if reason is FailureReason.HANG:
        change += " and the collective debug env (NCCL flight recorder)"
    found = Finding(Reason(reason), f"attempt {attempt}: {what}{where}; attempt {attempt + 1} "
                    f"in {wait} s with {change}, resuming from checkpoint step {ckpt or 0}")
    return Action(
        StatusFacts(found, record={"attempts": attempts, "restarts": restarts + 1,
                                   "nextAttempt": {"index": attempt + 1,
                                                   "notBefore": _at(now, wait)}}),
        delete_ray_cluster=rc,
        events=[("Warning", Reason(reason), found.message)],
        restart_reason=reason.value,
    )


def _ended(attempts: list[dict[str, Any]], found: Finding, rc: str | None, kind: str,
           **fields: Any) -> Action:
    return Action(
        StatusFacts(found, record={"attempts": attempts, **fields}),
        delete_ray_cluster=rc,
        events=[(kind, Reason(found.reason), found.message)],
    )


def start_next_attempt(job: JobRef, planner: Planner, status: dict[str, Any], now: str,
                       default_image: str = "", pods: list[dict[str, Any]] | None = None,
                       grace_seconds: float = 120.0,
                       pod_uid: int | None = IMAGE_UID) -> Action | None:
    """After the backoff, once the earlier attempts' pods are gone: the next attempt's
    children with the remediated plan. None while the backoff has not passed."""
    nxt = status.get("nextAttempt") or {}
    if not nxt or _time(now) < _time(str(nxt["notBefore"])):
        return None
    index = int(nxt["index"])
    lingering = sorted(str(p.get("metadata", {}).get("name")) for p in pods or []
                       if attempt_of(p) != str(index)
                       and pod_phase(p) not in ("Succeeded", "Failed"))
    waited = (_time(now) - _time(str(nxt["notBefore"]))).total_seconds()
    if lingering and waited < grace_seconds:
        # Two drivers of one job must never overlap on its checkpoints.
        return Action(StatusFacts(Finding(
            Reason.WAITING_FOR_PREVIOUS_ATTEMPT,
            f"attempt {index} starts once {len(lingering)} pod(s) of earlier attempts are "
            f"gone: {', '.join(lingering[:5])} (at most {grace_seconds:g} s more)")))
    action = _next_attempt(job, planner, status, now, default_image, pod_uid)
    if lingering:
        action.events.append(("Warning", Reason.PREVIOUS_ATTEMPT_LINGERS,
                               f"started attempt {index} although {', '.join(lingering[:5])} "
                               f"still exist after {waited:.0f} s (a lost node?); an older "
                               "driver cannot commit a checkpoint once a newer attempt exists"))
    return action


def _next_attempt(job: JobRef, planner: Planner, status: dict[str, Any], now: str,
                  default_image: str, pod_uid: int | None) -> Action:
    nxt = status["nextAttempt"]
    attempts = [dict(a) for a in status.get("attempts") or []]
    planned = planner.plan(attempts, recorded(status))
    if isinstance(planned, Refused):
        raise planned.error  # as an admitted job's spec does not: an operator defect
    spec, plan = planned.spec, planned.plan
    index = int(nxt["index"])
    resumed = _newest_checkpoint(attempts, status.get("progress") or {})
    record: dict[str, Any] = {"index": index, "startTime": now, "outcome": ATTEMPT_RUNNING}
    if resumed is not None:
        record["resumedFromStep"] = resumed
    rc = names.ray_cluster(job, index)
    saved = _measured_save_s(status)
    found = Finding(Reason.CREATING_CLUSTER, f"attempt {index}: creating RayCluster {rc}, "
                    f"resuming from checkpoint step {resumed or 0}")
    return Action(
        StatusFacts(found, record={
            "attempt": index, "attempts": [*attempts, record], "nextAttempt": None,
            "rayCluster": {"name": rc, "state": None, "admittedGeneration": None},
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


def _measured_save_s(status: dict[str, Any]) -> float | None:
    """The newest save's measured seconds (any attempt's: the same plan writes the same
    bytes, a remediated one rarely many more), None before the first save."""
    saved = (status.get("progress") or {}).get("saveSeconds")
    return float(saved) if isinstance(saved, int | float) and saved > 0 else None


def _after_hang(attempts: list[dict[str, Any]]) -> bool:
    """Whether the attempt that ended last hung: the next one (only) gets the collective
    debug env, to say where a collective is stuck if it hangs again."""
    return bool(attempts) and attempts[-1].get("outcome") == FailureReason.HANG.value


def _newest_checkpoint(attempts: list[dict[str, Any]], progress: dict[str, Any]) -> int | None:
    """The step the next attempt resumes from. The ended attempt's record may lag: its
    trainer can commit (and report) a checkpoint after the operator recorded the end, e.g.
    while KubeRay is still deleting a preempted cluster's pods. The next attempt starts
    only once those pods are gone, so the last report is final by now; the ended
    attempt's record is brought up to it (`attempts` is changed in place)."""
    recorded = next((a.get("lastCheckpointStep") for a in reversed(attempts)
                     if a.get("lastCheckpointStep") is not None), None)
    reported = progress.get("lastCheckpointStep")
    if reported is not None and (recorded is None or reported > recorded):
        if attempts:
            attempts[-1]["lastCheckpointStep"] = reported
        return int(reported)
    return None if recorded is None else int(recorded)


def failed_for(attempts: list[dict[str, Any]], now: str) -> float | None:
    """Seconds since the last attempt ended (from status, so an operator restart during
    the backoff keeps the figure)."""
    ended = attempts[-1].get("endTime") if attempts else None
    return (_time(now) - _time(str(ended))).total_seconds() if ended else None
