"""Reconcile decisions for one GRPOJob (pure): what to create, what status to write.

Handlers gather state, call these, and apply the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .api import GRPOJobSpec, SpecError, parse_spec
from .planner import InfeasibleError, Plan, plan_memory, plan_status
from .reconcile.classify import PodOutcome
from .reconcile.status import PhaseView, conditions_for
from .render import JobRef, render_children

TERMINAL = ("Succeeded", "Failed")


@dataclass
class Decision:
    """The result of reconciling a job once."""

    status: dict[str, Any]
    children: list[dict[str, Any]] = field(default_factory=list)
    delete_ray_cluster: str | None = None
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, msg)


def planned(spec_body: dict[str, Any]) -> tuple[GRPOJobSpec, Plan]:
    """Parse and plan; raises SpecError / InfeasibleError / ValueError with the reason."""
    spec = parse_spec(spec_body)
    return spec, plan_memory(spec)


def failed_status(view: PhaseView, generation: int, now: str,
                  previous: dict[str, Any]) -> dict[str, Any]:
    return {"phase": "Failed", "observedGeneration": generation,
            "conditions": conditions_for(view, generation, now, previous.get("conditions"))}


def reconcile(job: JobRef, spec_body: dict[str, Any], status: dict[str, Any], generation: int,
              now: str, default_image: str = "") -> Decision:
    """Decide children and status for a job on create/resume/spec change."""
    if status.get("phase") in TERMINAL:
        return Decision(status={})
    try:
        spec, plan = planned(spec_body)
    except SpecError as exc:
        view = PhaseView("Failed", "InvalidSpec", str(exc))
        return Decision(failed_status(view, generation, now, status),
                        events=[("Warning", "InvalidSpec", str(exc))])
    except (InfeasibleError, ValueError) as exc:
        view = PhaseView("Failed", "Infeasible", str(exc))
        return Decision(failed_status(view, generation, now, status),
                        events=[("Warning", "Infeasible", str(exc))])
    attempt = int(status.get("attempt") or 0)
    rc_name = f"{job.name}-a{attempt}"
    if spec.suspend:
        view = PhaseView("Suspended", "SuspendedByUser",
                         "spec.suspend is true: Ray pods released, checkpoints and status kept")
        return Decision(
            {"phase": "Suspended", "observedGeneration": generation,
             "conditions": conditions_for(view, generation, now, status.get("conditions"))},
            delete_ray_cluster=rc_name,
            events=[("Normal", "Suspended", view.message)],
        )
    children = render_children(spec, plan, job, attempt, default_image)
    attempts = list(status.get("attempts") or [])
    new: dict[str, Any] = {"observedGeneration": generation, "attempt": attempt,
                           "rayCluster": {"name": rc_name}}
    events: list[tuple[str, str, str]] = []
    if not any(a.get("index") == attempt for a in attempts):
        attempts.append({"index": attempt, "startTime": now, "outcome": "Running"})
        new["attempts"] = attempts
        new["plan"] = plan_status(plan).to_wire()
        new["restarts"] = int(status.get("restarts") or 0)
        settings = plan.settings
        events.append(("Normal", "Planned",
                       f"{plan.world_size} x {plan.geometry.gpu}; gradient checkpointing "
                       f"{settings.gradient_checkpointing}, offload params "
                       f"{settings.offload_params}, offload optimizer "
                       f"{settings.offload_optimizer}, micro-batch {settings.micro_batch_size}; "
                       f"peak {plan.budget.peak_gpu_gib:.1f} GiB/GPU, "
                       f"{plan.budget.peak_host_gib:.0f} GiB host/node"))
    if status.get("phase") in (None, "Suspended"):
        view = PhaseView("Pending", "CreatingCluster", f"creating RayCluster {rc_name}")
        new["phase"] = "Pending"
        new["conditions"] = conditions_for(view, generation, now, status.get("conditions"))
        if status.get("phase") == "Suspended":
            events.append(("Normal", "Resumed", f"resuming attempt {attempt} from its "
                           "newest complete checkpoint"))
    return Decision(new, children=children, events=events)


def observed_status(view: PhaseView, status: dict[str, Any], generation: int,
                    now: str) -> dict[str, Any]:
    """Status patch for a live attempt; {} when nothing a user would see changed."""
    conds = conditions_for(view, generation, now, status.get("conditions"))
    if status.get("phase") == view.phase and _same(conds, status.get("conditions") or []):
        return {}
    return {"phase": view.phase, "conditions": conds}


def _same(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> bool:
    key = ("type", "status", "reason", "message")
    return [tuple(c.get(k) for k in key) for c in a] == [tuple(c.get(k) for k in key) for c in b]


def finish_attempt(status: dict[str, Any], outcome: PodOutcome, generation: int,
                   now: str) -> Decision:
    """The head's trainer ended: record the attempt; Succeeded releases the cluster."""
    attempt = int(status.get("attempt") or 0)
    attempts = [dict(a) for a in status.get("attempts") or []]
    record = next((a for a in attempts if a.get("index") == attempt), None)
    if record is None or record.get("outcome") != "Running":
        return Decision(status={})  # already recorded (event and delete handler both call)
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
    ok = outcome.reason.value == "Succeeded"
    view = (PhaseView("Succeeded", "TrainingFinished", f"attempt {attempt}: {outcome.message}")
            if ok else PhaseView("Failed", outcome.reason.value,
                                 f"attempt {attempt}: {outcome.message}"))
    return Decision(
        {"phase": view.phase, "attempts": attempts,
         "conditions": conditions_for(view, generation, now, status.get("conditions"))},
        delete_ray_cluster=(status.get("rayCluster") or {}).get("name"),
        events=[("Normal" if ok else "Warning", view.reason, view.message)],
    )
