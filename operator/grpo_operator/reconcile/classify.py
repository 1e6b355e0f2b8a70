"""Classify how a Ray pod ended, from its status and the trainer's termination message.

Pure: the input is the pod as the API server returns it (a dict), plus whether it
was deleted. Table-driven tests use real pod status shapes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from grpo_api.contract import RAY_SIDE_ROLLOUT, ExitCode, FailureReason, RankStage, Role

from .conditions import role, unschedulable

_EXIT_CLASSES = {
    ExitCode.FINISHED: FailureReason.SUCCEEDED,
    ExitCode.CONFIG_ERROR: FailureReason.CONFIG_ERROR,
    ExitCode.CUDA_OOM: FailureReason.CUDA_OOM,
    ExitCode.HOST_OOM: FailureReason.RAY_OOM,
    ExitCode.WORKER_LOST: FailureReason.NODE_LOST,
    ExitCode.HANG: FailureReason.HANG,
    ExitCode.TERMINATED: FailureReason.TERMINATED,
    ExitCode.CHECKPOINT_INCOMPATIBLE: FailureReason.CHECKPOINT_INCOMPATIBLE,
}
# The detail a status shows: one line for most failures. A Hang's names the stuck rank,
# its frame (a full path in the image) and where the stacks file is, and a
# CheckpointIncompatible's the step, the keys and what to do, which 300 characters can
# cut; their termination messages are one line, kept within 4 KiB.
DETAIL_CHARS = 300
LONG_DETAIL_CHARS = 1500
_LONG_DETAILS = (FailureReason.HANG, FailureReason.CHECKPOINT_INCOMPATIBLE)


@dataclass(frozen=True)
class Exported:
    """The final model the trainer exported (the termination message's `export`)."""

    path: str  # in the pod, under the checkpoint mount
    step: int


def _exported(msg: dict[str, Any]) -> Exported | None:
    export = msg.get("export")
    if not isinstance(export, dict):
        return None
    path, step = export.get("path"), export.get("step")
    if not isinstance(path, str) or not path or not isinstance(step, int) or step < 0:
        return None
    return Exported(path, step)


@dataclass(frozen=True)
class PodOutcome:
    """How one container ended."""

    reason: FailureReason
    exit_code: int | None
    message: str  # one line for humans
    step: int | None = None
    last_checkpoint_step: int | None = None
    # What the ranks were doing when it failed (the termination message's "stage").
    failed_during: RankStage | None = None
    export: Exported | None = None  # a succeeded trainer's exported model
    # RAY_SIDE_ROLLOUT: a disaggregated job's rollout side failed (a rollout pod ended);
    # its memory ladder acts on that side only. None: the training side, or colocated.
    side: str | None = None
    # The Kubernetes node of a pod lost with its node or evicted from it: the next
    # attempt avoids it (attempts.nodes_to_avoid).
    node: str | None = None


def container_state(pod: dict[str, Any], container: str | None = None) -> dict[str, Any]:
    """`state` of the named (or first) container, {} if it has none yet."""
    statuses = pod.get("status", {}).get("containerStatuses") or []
    for cs in statuses:
        if container is None or cs.get("name") == container:
            return dict(cs.get("state") or {})
    return {}


def _termination_message(raw: str) -> dict[str, Any]:
    try:
        msg = json.loads(raw)
    except (ValueError, TypeError):
        return {}
    return msg if isinstance(msg, dict) else {}


def classify_pod(pod: dict[str, Any], deleted: bool = False,
                 container: str | None = None) -> PodOutcome | None:
    """The outcome of a pod whose main container ended; None while it has not."""
    status = pod.get("status", {})
    node = pod.get("spec", {}).get("nodeName")
    if status.get("reason") == "Evicted":
        return PodOutcome(FailureReason.EVICTED, None,
                          status.get("message") or "pod evicted by the kubelet", node=node)
    conditions = {c.get("type"): c for c in status.get("conditions") or []}
    disruption = conditions.get("DisruptionTarget")
    if disruption and disruption.get("status") == "True":
        kind = (FailureReason.PREEMPTED if "Preempt" in str(disruption.get("reason"))
                else FailureReason.EVICTED)
        return PodOutcome(kind, None, disruption.get("message") or str(disruption.get("reason")),
                          node=node if kind is FailureReason.EVICTED else None)
    for init in status.get("initContainerStatuses") or []:  # the head's hub fetch
        failed = (init.get("state") or {}).get("terminated") or {}
        if failed and failed.get("exitCode", 0) != 0:
            code = int(failed["exitCode"])
            why = str(failed.get("message") or failed.get("reason") or "")[:300]
            return PodOutcome(FailureReason.ERROR, code,
                              f"init container {init.get('name')} failed (exit {code}): {why}")
    term = container_state(pod, container).get("terminated")
    if not term:
        if deleted:
            return PodOutcome(FailureReason.NODE_LOST, None,
                              f"pod deleted while running on node {node or '?'}", node=node)
        return None
    code = int(term.get("exitCode", 1))
    raw = term.get("message") or ""
    msg = _termination_message(raw)
    step = msg.get("step")
    ckpt = msg.get("lastCheckpointStep")
    detail = str(msg.get("detail") or term.get("reason") or "")
    if term.get("reason") == "OOMKilled" or (code == 137 and not msg):
        # The kernel killed the container at its memory limit: host RAM, not the GPU.
        return PodOutcome(FailureReason.HOST_OOM, code,
                          f"container OOMKilled at its memory limit (exit {code})", step, ckpt)
    if msg.get("reason") in FailureReason.__members__.values():
        reason = FailureReason(msg["reason"])
    else:
        reason = _EXIT_CLASSES.get(code, FailureReason.ERROR)  # type: ignore[call-overload]
    detail = detail[:LONG_DETAIL_CHARS if reason in _LONG_DETAILS else DETAIL_CHARS]
    where = f" at step {step}" if step is not None else ""
    text = "finished" if reason is FailureReason.SUCCEEDED else f"{reason.value}{where}"
    # "phase": its name in older trainer images' messages.
    during = str(msg.get("stage") or msg.get("phase") or "")
    return PodOutcome(reason, code, f"{text} (exit {code}){': ' + detail if detail else ''}",
                      step, ckpt,
                      RankStage(during) if during in RankStage.__members__.values() else None,
                      _exported(msg) if reason is FailureReason.SUCCEEDED else None)


# A worker pod that ends takes its ranks with it (the trainer has no elasticity), so the
# attempt ends; these causes of a worker's end are kept as the attempt's class (HostOOM
# runs the host-memory ladder). Any other end of a worker (an exit of `ray start`, a
# delete while it ran) is a lost node: its exit code says nothing about the job.
_WORKER_CLASSES = (FailureReason.HOST_OOM, FailureReason.EVICTED, FailureReason.PREEMPTED)


def _ran(pod: dict[str, Any]) -> bool:
    """Whether any container of the pod started (a pod that never ran lost no rank)."""
    status = pod.get("status", {})
    if status.get("phase") in ("Running", "Succeeded", "Failed"):
        return True
    return any(set(cs.get("state") or {}) & {"running", "terminated"}
               for cs in status.get("containerStatuses") or [])


def worker_outcome(pod: dict[str, Any], deleted: bool = False) -> PodOutcome | None:
    """What a worker pod's end means for its attempt; None while it has not ended, when
    it was deleted before it ever ran (KubeRay creates another), or for a rollout pod
    lost for a reason other than its memory (the attempt goes on without it)."""
    if deleted and not _ran(pod):
        return None
    out = classify_pod(pod, deleted=deleted)
    if out is None:
        return None
    name = pod.get("metadata", {}).get("name", "?")
    reason = out.reason if out.reason in _WORKER_CLASSES else FailureReason.NODE_LOST
    if role(pod) == Role.ROLLOUT:  # the vLLM engines' pod: the rollout side's failure
        if reason is FailureReason.NODE_LOST:
            # No rank is lost: KubeRay creates the pod again and the driver restarts the
            # engine on it, which joins the weight group and gets the current weights
            # (docs/trainer.md). Only a driver that cannot go on ends the attempt (its
            # head pod's end, read with this pod's in `in_context`).
            return None
        return PodOutcome(reason, out.exit_code, f"rollout pod {name}: {out.message}",
                          side=RAY_SIDE_ROLLOUT, node=out.node)
    # A worker that ended any other way than its own memory or a preemption: its node.
    node = (pod.get("spec", {}).get("nodeName")
            if reason in (FailureReason.NODE_LOST, FailureReason.EVICTED) else None)
    return PodOutcome(reason, out.exit_code, f"worker pod {name}: {out.message}", node=node)



# A head whose driver exited for these could not keep or get its ranks: the attempt's
# worker pods say why (decided in `in_context`).
LOST_RANKS = (FailureReason.NODE_LOST, FailureReason.WORKERS_MISSING)


def in_context(head: PodOutcome, pods: list[dict[str, Any]]) -> PodOutcome:
    """The head's outcome read with its attempt's pods: a worker that ended first gives
    its cause (an OOM-killed worker's ranks die, the driver sees dead actors and exits 5:
    the pod that died decides); ranks that never joined are named with what their pods
    wait for (Pending, an image pull), which the driver cannot see."""
    if head.reason is FailureReason.WORKERS_MISSING:
        waiting = _waiting_workers(pods)
        if not waiting:
            return head
        return PodOutcome(head.reason, head.exit_code,
                          f"{head.message}; worker pods not running: {'; '.join(waiting)}",
                          head.step, head.last_checkpoint_step)
    return _first_worker_end(head, pods)


def _waiting_workers(pods: list[dict[str, Any]]) -> list[str]:
    out = []
    for p in pods:
        status = p.get("status") or {}
        if role(p) == Role.HEAD or status.get("phase") == "Running":
            continue
        why = unschedulable(p)
        why = why and f"Unschedulable: {why}"
        waiting = [(cs.get("state") or {}).get("waiting") or {}
                   for cs in status.get("containerStatuses") or []]
        why = why or next((f"{w.get('reason')}: {w.get('message') or ''}".rstrip(": ")
                           for w in waiting if w.get("reason")), None)
        out.append(f"{p.get('metadata', {}).get('name')} {why or status.get('phase') or '?'}")
    return out[:8]


def _first_worker_end(head: PodOutcome, pods: list[dict[str, Any]]) -> PodOutcome:
    """The head's outcome, or the cause of the worker pod that ended before it (a
    memory class first), with the driver's own words kept after it."""
    ended = [o for o in (worker_outcome(p) for p in pods) if o is not None]
    if not ended:
        return head
    cause = next((o for o in ended if o.reason is not FailureReason.NODE_LOST), ended[0])
    return PodOutcome(cause.reason, head.exit_code,
                      f"{cause.message}; then the driver: {head.message}",
                      head.step, head.last_checkpoint_step, side=cause.side, node=cause.node)
