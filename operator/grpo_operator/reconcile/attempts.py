"""An attempt's life (pure): start it, record how it ended, start the next one.

`core.reconcile` calls these; each returns the Action for one event, with what it found
as StatusFacts (the status is derived from them once, in status.py). Planning is in
planning.py, the claims' checks in claims.py.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from grpo_api.catalog import GPU_CATALOG, GpuType
from grpo_api.contract import (
    ATTEMPT_RUNNING,
    TERMINAL_PHASES,
    FailureReason,
    Phase,
    Reason,
)
from grpo_api.job import SpecError

from ..planner import InfeasibleError, next_safer_plan, plan_status
from ..render import JobRef, names, render_children
from .action import Action
from .classify import PodOutcome
from .conditions import JobEvent, PhaseView, attempt_of
from .model_config import recorded
from .planning import MEMORY_CLASSES, backoff_seconds, planned
from .retention import export_status, recreate_advice
from .status import StatusFacts

PER_ATTEMPT_KINDS = ("ConfigMap", "RayCluster")
PERMANENT = (FailureReason.CONFIG_ERROR,)  # retrying cannot help
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




def ensure_attempt(job: JobRef, spec_body: dict[str, Any], status: dict[str, Any],
                   now: str, default_image: str = "",
                   catalog: Mapping[str, GpuType] = GPU_CATALOG) -> Action:
    """Children and status of the current attempt, on create/resume/spec change."""
    if status.get("phase") in TERMINAL_PHASES or status.get("nextAttempt"):
        return Action()  # done, or the restart timer owns the next step
    bad_name = names.job_name_problem(job.name)  # the CRD refuses these; older CRDs did not
    if bad_name:
        view = PhaseView(Phase.FAILED, Reason.INVALID_NAME, bad_name)
        return Action(StatusFacts(view),
                      events=[("Warning", Reason.INVALID_NAME, bad_name)])
    attempts_so_far = [a for a in status.get("attempts") or []
                       if a.get("index") != status.get("attempt")]
    try:
        spec, plan = planned(spec_body, attempts_so_far, catalog, recorded(status))
    except SpecError as exc:
        view = PhaseView(Phase.FAILED, Reason.INVALID_SPEC, str(exc))
        return Action(StatusFacts(view),
                      events=[("Warning", Reason.INVALID_SPEC, str(exc))])
    except (InfeasibleError, ValueError) as exc:
        view = PhaseView(Phase.FAILED, Reason.INFEASIBLE, str(exc))
        return Action(StatusFacts(view),
                      events=[("Warning", Reason.INFEASIBLE, str(exc))])
    attempt = int(status.get("attempt") or 0)
    rc_name = names.ray_cluster(job, attempt)
    if spec.suspend:
        view = PhaseView(Phase.SUSPENDED, Reason.SUSPENDED_BY_USER,
                         "spec.suspend is true: Ray pods released, checkpoints and status kept")
        return Action(
            StatusFacts(view),
            delete_ray_cluster=rc_name,
            events=[("Normal", Reason.SUSPENDED, view.message)],
        )
    saved = _measured_save_s(status)
    children = render_children(spec, plan, job, attempt, default_image,
                               measured_save_s=saved)
    attempts = list(status.get("attempts") or [])
    fields: dict[str, Any] = {"attempt": attempt, "rayCluster": {"name": rc_name}}
    events: list[JobEvent] = []
    if not any(a.get("index") == attempt for a in attempts):
        attempts.append({"index": attempt, "startTime": now, "outcome": ATTEMPT_RUNNING})
        fields |= {"attempts": attempts, "plan": plan_status(plan, saved).to_wire(),
                   "restarts": int(status.get("restarts") or 0)}
        settings = plan.settings
        events.append(("Normal", Reason.PLANNED,
                       f"{plan.world_size} x {plan.geometry.gpu}; gradient checkpointing "
                       f"{settings.gradient_checkpointing}, offload params "
                       f"{settings.offload_params}, offload optimizer "
                       f"{settings.offload_optimizer}, micro-batch {settings.micro_batch_size}; "
                       f"peak {plan.budget.peak_gpu_gib:.1f} GiB/GPU, "
                       f"{plan.budget.peak_host_gib:.0f} GiB host/node; model shape from "
                       f"{plan.geometry.shape_source}"))
    # A live attempt's phase follows its pods and cluster, not the spec.
    start: PhaseView | None = None
    if status.get("phase") in (None, Phase.SUSPENDED):
        start = PhaseView(Phase.PENDING, Reason.CREATING_CLUSTER, f"creating RayCluster {rc_name}")
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
    view = PhaseView(Phase.PENDING, Reason.CREATE_FAILED,
                     f"creating {kind} {name} failed: {api_message} (retrying every "
                     f"{CREATE_RETRY_SECONDS} s)")
    return Action(
        StatusFacts(view, degraded=True),
        events=[("Warning", Reason.CREATE_FAILED, view.message)],
        retry=(view.message, CREATE_RETRY_SECONDS))


def finish_attempt(status: dict[str, Any], outcome: PodOutcome, now: str,
                   spec_body: dict[str, Any] | None = None,
                   catalog: Mapping[str, GpuType] = GPU_CATALOG,
                   claim: str | None = None) -> Action:
    """The head's trainer ended: record the attempt, then succeed (with the exported
    model's place on the checkpoint `claim` in status.export), restart (after a
    backoff, with the next safer setting for its failure class) or give up."""
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
    if outcome.phase is not None:
        record["failedPhase"] = outcome.phase.value
    rc = (status.get("rayCluster") or {}).get("name")
    reason = outcome.reason
    if reason is FailureReason.SUCCEEDED:
        view = PhaseView(Phase.SUCCEEDED, Reason.TRAINING_FINISHED,
                         f"attempt {attempt}: {outcome.message}")
        exported = ({"export": export_status(outcome.export, claim)}
                    if outcome.export is not None and claim else {})
        return _ended(attempts, view, rc, "Normal", **exported)
    restarts = int(status.get("restarts") or 0)
    what = _WORDS.get(reason, reason.value)
    where = f" at step {step}" if step is not None else ""
    last = next((a["remediation"] for a in reversed(attempts[:-1]) if a.get("remediation")),
                None)
    if reason in PERMANENT or spec_body is None:
        view = PhaseView(Phase.FAILED, Reason(reason), f"attempt {attempt}: {outcome.message}; "
                         "not retried: fix the cause, then delete the job and create it "
                         f"again ({recreate_advice(spec_body)})")
        return _ended(attempts, view, rc, "Warning")
    spec, plan = planned(spec_body, attempts[:-1], catalog, recorded(status))
    if restarts >= spec.restart_policy.max_restarts:
        view = PhaseView(Phase.FAILED, Reason(reason),
                         f"{what}{where} after {restarts} restarts; last setting tried: "
                         f"{last or 'the planned settings'}")
        return _ended(attempts, view, rc, "Warning")
    remediation = None
    if spec.restart_policy.remediate and reason in MEMORY_CLASSES:
        safer = next_safer_plan(plan, reason, phase=outcome.phase)
        if safer is None:
            view = PhaseView(Phase.FAILED, Reason(reason),
                             f"{what}{where} after {restarts} restarts; every safer setting "
                             f"for {reason.value} was tried; last: "
                             f"{last or 'the planned settings'}")
            return _ended(attempts, view, rc, "Warning")
        remediation = safer.remediations[-1]
        record["remediation"] = remediation
    wait = backoff_seconds(spec, restarts)
    change = remediation or "the same settings (no memory ladder for this failure)"
    if reason is FailureReason.HANG:
        change += " and the collective debug env (NCCL flight recorder)"
    view = PhaseView(Phase.RESTARTING, Reason(reason),
                     f"attempt {attempt}: {what}{where}; attempt {attempt + 1} in {wait} s "
                     f"with {change}, resuming from checkpoint step {ckpt or 0}")
    return Action(
        StatusFacts(view, record={"attempts": attempts, "restarts": restarts + 1, "nextAttempt": {
            "index": attempt + 1, "notBefore": _at(now, wait)}}),
        delete_ray_cluster=rc,
        events=[("Warning", Reason(reason), view.message)],
        restart_reason=reason.value,
    )


def _ended(attempts: list[dict[str, Any]], view: PhaseView, rc: str | None, kind: str,
           **fields: Any) -> Action:
    return Action(
        StatusFacts(view, record={"attempts": attempts, **fields}),
        delete_ray_cluster=rc,
        events=[(kind, Reason(view.reason), view.message)],
    )


def start_next_attempt(job: JobRef, spec_body: dict[str, Any], status: dict[str, Any],
                       now: str, default_image: str = "",
                       catalog: Mapping[str, GpuType] = GPU_CATALOG,
                       pods: list[dict[str, Any]] | None = None,
                       grace_seconds: float = 120.0) -> Action | None:
    """After the backoff, once the earlier attempts' pods are gone: the next attempt's
    children with the remediated plan. None while the backoff has not passed."""
    nxt = status.get("nextAttempt") or {}
    if not nxt or _time(now) < _time(str(nxt["notBefore"])):
        return None
    index = int(nxt["index"])
    lingering = sorted(str(p.get("metadata", {}).get("name")) for p in pods or []
                       if attempt_of(p) != str(index)
                       and p.get("status", {}).get("phase") not in ("Succeeded", "Failed"))
    waited = (_time(now) - _time(str(nxt["notBefore"]))).total_seconds()
    if lingering and waited < grace_seconds:
        # Two drivers of one job must never overlap on its checkpoints.
        view = PhaseView(Phase.RESTARTING, Reason.WAITING_FOR_PREVIOUS_ATTEMPT,
                         f"attempt {index} starts once {len(lingering)} pod(s) of earlier "
                         f"attempts are gone: {', '.join(lingering[:5])} (at most "
                         f"{grace_seconds:g} s more)")
        return Action(StatusFacts(view))
    action = _next_attempt(job, spec_body, status, now, default_image, catalog)
    if lingering:
        action.events.append(("Warning", Reason.PREVIOUS_ATTEMPT_LINGERS,
                               f"started attempt {index} although {', '.join(lingering[:5])} "
                               f"still exist after {waited:.0f} s (a lost node?); an older "
                               "driver cannot commit a checkpoint once a newer attempt exists"))
    return action


def _next_attempt(job: JobRef, spec_body: dict[str, Any], status: dict[str, Any],
                  now: str, default_image: str,
                  catalog: Mapping[str, GpuType]) -> Action:
    nxt = status["nextAttempt"]
    attempts = [dict(a) for a in status.get("attempts") or []]
    spec, plan = planned(spec_body, attempts, catalog, recorded(status))
    index = int(nxt["index"])
    resumed = _newest_checkpoint(attempts, status.get("progress") or {})
    record: dict[str, Any] = {"index": index, "startTime": now, "outcome": ATTEMPT_RUNNING}
    if resumed is not None:
        record["resumedFromStep"] = resumed
    rc = names.ray_cluster(job, index)
    saved = _measured_save_s(status)
    view = PhaseView(Phase.PENDING, Reason.CREATING_CLUSTER,
                     f"attempt {index}: creating RayCluster {rc}, resuming "
                     f"from checkpoint step {resumed or 0}")
    return Action(
        StatusFacts(view, record={
            "attempt": index, "attempts": [*attempts, record], "nextAttempt": None,
            "rayCluster": {"name": rc, "state": None, "admittedGeneration": None},
            "plan": plan_status(plan, saved).to_wire()}),
        # Only what is new per attempt: the claim and the trainer's RBAC exist since
        # attempt 0 (and reconcile re-ensures them), so a restart skips four creates.
        children=[c for c in render_children(spec, plan, job, index, default_image,
                                             debug_collectives=_after_hang(attempts),
                                             measured_save_s=saved)
                  if c["kind"] in PER_ATTEMPT_KINDS],
        events=[("Normal", Reason.RESTARTED, view.message)],
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
