"""What the cluster shows of the live attempt, and the job's conditions (pure)."""

from __future__ import annotations

from typing import Any

from grpo_api.contract import (
    ATTEMPT_LABEL,
    PHASE_CONDITIONS,
    ROLE_LABEL,
    ConditionType,
    Reason,
    Role,
    not_reason,
)
from grpo_api.job.memory_peaks import compared, overruns
from grpo_api.job.status import Condition, PlanStatus, ProgressStatus

from .phases import Finding, JobPhaseView

# A Kubernetes event on the job: (type Normal or Warning, reason, message).
JobEvent = tuple[str, Reason, str]


def role(pod: dict[str, Any]) -> str:
    return str(pod.get("metadata", {}).get("labels", {}).get(ROLE_LABEL, ""))


def pod_phase(pod: dict[str, Any]) -> str | None:
    """The pod's own phase (Pending, Running, Succeeded, Failed), as the kubelet reports it."""
    phase = pod.get("status", {}).get("phase")
    return None if phase is None else str(phase)


def attempt_of(obj: dict[str, Any]) -> str | None:
    """The attempt a Ray pod or RayCluster belongs to (its ATTEMPT_LABEL)."""
    return (obj.get("metadata", {}).get("labels") or {}).get(ATTEMPT_LABEL)


def unschedulable(pod: dict[str, Any]) -> str | None:
    """Why the scheduler cannot place the pod, or None."""
    for c in pod.get("status", {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return str(c.get("message") or c.get("reason") or "not scheduled")
    return None


def unschedulable_finding(pod: dict[str, Any]) -> Finding | None:
    why = unschedulable(pod)
    if why is None:
        return None
    return Finding(Reason.UNSCHEDULABLE,
                   f"pod {pod['metadata']['name']} cannot be scheduled: {why}")


# KubeRay's RayCluster .status.state once every Ray pod is running and ready.
RAY_CLUSTER_READY = "ready"


def workers_expected(plan: PlanStatus | None) -> int:
    """Worker pods the live attempt's plan (status.plan) asks for: the training side's
    and, disaggregated, the rollout side's (both worker groups' pods are non-head pods)."""
    if plan is None:
        return 0
    return plan.nodes + (plan.rollout.nodes if plan.rollout is not None else 0)


def cluster_finding(ray_cluster: dict[str, Any] | None, pods: list[dict[str, Any]],
                    workers_expected: int) -> Finding:
    """How far the live attempt's cluster and pods are: not created, waiting for pods,
    starting, running (how an attempt ends comes from classify_pod on the head)."""
    if ray_cluster is None:
        return Finding(Reason.CREATING_CLUSTER, "creating the RayCluster")
    live = [p for p in pods if not p.get("metadata", {}).get("deletionTimestamp")]
    for p in live:
        found = unschedulable_finding(p)
        if found:
            return found
    heads = [p for p in live if role(p) == Role.HEAD]
    workers = [p for p in live if role(p) != Role.HEAD]
    running = [p for p in live if pod_phase(p) == "Running"]
    if (ray_cluster.get("status") or {}).get("state") == RAY_CLUSTER_READY or (
            heads and len(running) == len(live) and len(workers) >= workers_expected):
        return Finding(Reason.CLUSTER_RUNNING, f"head and {workers_expected} worker pod(s) running")
    if not heads:
        return Finding(Reason.WAITING_FOR_PODS, "waiting for KubeRay to create the head pod")
    return Finding(Reason.PODS_STARTING,
                   f"{len(running)} of {1 + workers_expected} Ray pods running")


def _condition(kind: ConditionType, status: str, reason: str, message: str, since: str,
               generation: int) -> Condition:
    # Not validated: built from the operator's own reasons and words (and Kueue's),
    # written as they are, as before the status was typed.
    return Condition.model_construct(type=kind, status=status, reason=reason, message=message,
                                     last_transition_time=since,
                                     observed_generation=generation)


def conditions_for(view: JobPhaseView, finding: Finding, generation: int, now: str,
                   previous: list[Condition] | None = None) -> list[Condition]:
    """All the phase conditions for what the job shows (phases.phase_view): those that hold
    and Ready and Progressing carry the finding's reason and message; lastTransitionTime
    is kept while a condition's status holds. Conditions of other types (MemoryGrowth,
    HubFetch, from the trainer's reports) are kept."""
    before = {c.type: c for c in previous or []}
    out = []
    for t in PHASE_CONDITIONS:
        status = "True" if t in view.holds else "False"
        reason, message = (finding.reason, finding.message) if status == "True" or t in (
            ConditionType.READY, ConditionType.PROGRESSING) else (not_reason(t), "")
        old = before.get(t)
        ltt = old.last_transition_time if old and old.status == status else now
        out.append(_condition(t, status, reason, message, ltt, generation))
    return out + [c for c in previous or [] if c.type not in PHASE_CONDITIONS]


MEMORY_GROWTH = ConditionType.MEMORY_GROWTH


def memory_growth_conditions(progress: ProgressStatus | None,
                             conditions: list[Condition], generation: int,
                             now: str) -> list[Condition] | None:
    """The conditions with MemoryGrowth following the trainer's latest report, or None
    when nothing changes. The trainer's leak detector writes ``progress.memoryGrowth``
    (a message) while it sees sustained growth; its absence in a report clears it."""
    message = progress.memory_growth if progress is not None else None
    current = next((c for c in conditions if c.type == MEMORY_GROWTH), None)
    if message:
        want = ("True", Reason.SUSTAINED_GROWTH, message)
    elif current is not None and current.status == "True" and _reported(progress):
        want = ("False", Reason.NO_GROWTH, "")
    else:
        return None
    return _with_condition(conditions, MEMORY_GROWTH, want, generation, now)


def _reported(progress: ProgressStatus | None) -> bool:
    """Whether the trainer reported anything (an empty progress says nothing)."""
    return progress is not None and bool(progress.model_fields_set or progress.model_extra)


def _with_condition(conditions: list[Condition], kind: ConditionType,
                    want: tuple[str, Reason, str], generation: int,
                    now: str) -> list[Condition] | None:
    """`conditions` with the one of type `kind` set to `want` (status, reason, message);
    None if it already is."""
    status, reason, message = want
    current = next((c for c in conditions if c.type == kind), None)
    if current is not None and (current.status, current.reason, current.message) == want:
        return None
    ltt = current.last_transition_time if current is not None and \
        current.status == status else now
    cond = _condition(kind, status, reason, message, ltt, generation)
    return [c for c in conditions if c.type != kind] + [cond]


HUB_FETCH = ConditionType.HUB_FETCH


def hub_fetch_conditions(progress: ProgressStatus | None,
                         conditions: list[Condition], generation: int,
                         now: str) -> list[Condition] | None:
    """The conditions with HubFetch following the head's fetch report (bytes done of
    total, the file), or None when nothing changes."""
    fetch = progress.fetch if progress is not None else None
    if fetch is None:
        return None
    size = f"{fetch.bytes_done / 2**30:.2f} of {fetch.bytes_total / 2**30:.2f} GiB"
    if fetch.state == "Fetched":
        want = ("True", Reason.FETCHED, f"{fetch.repo}: {size}")
    elif fetch.state == "Failed":
        want = ("False", Reason.FETCH_FAILED, fetch.message or fetch.repo)
    else:
        want = ("False", Reason.FETCHING, f"{fetch.repo}: {size}, now {fetch.file or '-'}")
    return _with_condition(conditions, HUB_FETCH, want, generation, now)


FABRIC_FALLBACK = ConditionType.FABRIC_FALLBACK


def fabric_conditions(progress: ProgressStatus | None, plan: PlanStatus | None,
                      conditions: list[Condition], generation: int,
                      now: str) -> list[Condition] | None:
    """The conditions with FabricFallback following the ranks' transport report
    (``progress.transport``, from NCCL's own log lines), or None when nothing changes.

    Only for a job across nodes whose workers request a fabric (``plan.fabrics``): True
    (SocketFallback) when NCCL crossed nodes over TCP sockets, with NCCL's words for why
    it passed the fabric over; False (FabricInUse) when it crossed them over a fabric."""
    transport = progress.transport if progress is not None else None
    if transport is None or plan is None or not plan.fabrics or plan.nodes < 2:
        return None
    network = transport.network
    inside = ", ".join(transport.intra_node) or "not reported"
    if network == "Socket":
        causes = "; ".join(transport.causes[:4])
        message = (
            f"the workers request {' and '.join(plan.fabrics)} devices, but NCCL on attempt "
            f"{transport.attempt} crossed nodes over TCP sockets (NET/Socket): "
            f"{causes or 'NCCL named no cause'}. Check that the image loads "
            "libibverbs.so.1 (InfiniBand) or carries aws-ofi-nccl (EFA), that the worker "
            "pods get the devices, and that spec.pods sets no NCCL_NET or NCCL_IB_DISABLE "
            "(docs/troubleshooting.md)")
        want = ("True", Reason.SOCKET_FALLBACK, message)
    elif network and transport.inter_node:
        want = ("False", Reason.FABRIC_IN_USE,
                f"NCCL crosses nodes over {network}; inside a node {inside}")
    else:
        return None
    return _with_condition(conditions, FABRIC_FALLBACK, want, generation, now)


MEMORY_PLAN = ConditionType.MEMORY_PLAN


def memory_plan_conditions(progress: ProgressStatus | None, plan: PlanStatus | None,
                           attempt: int | None, conditions: list[Condition],
                           generation: int, now: str) -> list[Condition] | None:
    """The conditions with MemoryPlan following the live attempt's measured peaks
    (``progress.measuredPeaks``) against its plan's (``plan.peaks``), or None when nothing
    changes: False (Underestimated) once a reading passes the plan, naming each and by how
    much, before an OOM; True (WithinPlan) while none does. A report of an earlier
    attempt, measured under another plan, is not compared."""
    measured = progress.measured_peaks if progress is not None else None
    if measured is None or plan is None or plan.peaks is None or measured.attempt != attempt:
        return None
    over = overruns(plan.peaks, measured)
    when = f"attempt {measured.attempt} by step {measured.step}"
    if over:
        want = ("False", Reason.UNDERESTIMATED,
                f"{when}: " + "; ".join(f"{o:.1f}" for o in over)
                + ". The margin held it so far; a restart with safer settings is what an "
                "OOM would bring (docs/troubleshooting.md, MemoryPlan Underestimated)")
    elif compared(plan.peaks, measured):
        want = ("True", Reason.WITHIN_PLAN,
                f"{when}: every measured peak is within the plan's (progress.measuredPeaks "
                "beside plan.peaks)")
    else:
        return None
    return _with_condition(conditions, MEMORY_PLAN, want, generation, now)


CHECKPOINT_UPLOAD = ConditionType.CHECKPOINT_UPLOAD


def checkpoint_upload_conditions(progress: ProgressStatus | None,
                                 conditions: list[Condition], generation: int,
                                 now: str) -> list[Condition] | None:
    """The conditions with CheckpointUpload following the driver's report of the newest
    save's upload to spec.checkpoint.store (``progress.checkpointUpload``), or None when
    nothing changes: True (Uploaded) once a checkpoint is complete in the store; False
    (UploadRetrying) while the store fails its upload and the ranks retry. A save whose
    files are still going up without an error changes nothing."""
    upload = progress.checkpoint_upload if progress is not None else None
    if upload is None or upload.state == "Uploading":
        return None
    if upload.state == "Uploaded":
        want = ("True", Reason.UPLOADED,
                f"checkpoint step {upload.step} is complete in the store ({upload.tries} "
                f"requests, {upload.waited_seconds:.0f} s)")
    else:
        want = ("False", Reason.UPLOAD_RETRYING,
                f"checkpoint step {upload.step}: the store failed its upload, retried with "
                f"backoff for {upload.waited_seconds:.0f} s ({upload.tries} requests so far): "
                f"{upload.message or 'no answer'}. Training goes on; the job fails if no "
                "checkpoint completes within checkpoint.store.uploadDeadlineSeconds")
    return _with_condition(conditions, CHECKPOINT_UPLOAD, want, generation, now)
