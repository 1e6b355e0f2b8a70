"""A job's plan (pure): planned and checked as admission checks it; the plan of the
attempt after a memory failure (the ladder replayed from status.attempts); the restart
backoff. Within one decision the spec is parsed once and planned at most once
(`Planner`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from grpo_api.catalog import GPU_CATALOG, GpuType
from grpo_api.contract import Reason
from grpo_api.job import GRPOJobSpec, SpecError, parse_spec
from grpo_api.job.recovery import RESTART_CLASSES
from grpo_api.job.status import AttemptRecord
from grpo_api.job.trainer import config_sources
from grpo_api.model.families import weight_sync_problem

from ..planner import InfeasibleError, Plan, UnsupportedArchitecture, next_safer_plan, plan_memory
from ..planner.network import image_problem, plan_network
from ..render import JobRef, pod_settings
from ..render.children import logging_env, store_env
from ..render.trainer_config import trainer_config
from .model_config import PlanInput

MEMORY_CLASSES = RESTART_CLASSES["memory"]  # the failures the memory ladder answers


def planned(spec: GRPOJobSpec, attempts: list[AttemptRecord] | None = None,
            catalog: Mapping[str, GpuType] = GPU_CATALOG,
            model: PlanInput | None = None) -> Plan:
    """The plan; raises SpecError / InfeasibleError / ValueError with the reason.

    With `attempts`, the plan is the one for the attempt after them: the first plan with
    every remediation recorded in `attempts` replayed in order (the ladder is
    deterministic, so the operator keeps no plan state of its own). `model`: the
    model's config.json as read (status.modelConfig, model_config.py)."""
    plan = (checked_plan(spec, catalog, model.config, model.source) if model is not None
            else checked_plan(spec, catalog))
    for a in attempts or []:
        if a.remediation and a.outcome in MEMORY_CLASSES:
            plan = next_safer_plan(plan, a.outcome, stage=a.failed_stage,
                                   side=a.failed_side) or plan
    return plan


@dataclass(frozen=True)
class JobPlan:
    """A job that can run: its spec and the plan of an attempt."""

    spec: GRPOJobSpec
    plan: Plan
    # Spec fields the platform's defaults set -> where from (status.plan.inherited)
    inherited: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Refused:
    """Why a job cannot run: its spec does not parse (InvalidSpec) or cannot be planned
    (Infeasible); `error` is what was raised, with the reasons."""

    reason: Reason
    error: Exception


class Planner:
    """One decision's job spec, parsed once, and its plan, made only when a step needs
    one: `reconcile` makes one per decision and passes it down; `runs` counts the
    planner's runs (at most one a decision; the handler records it as a metric)."""

    def __init__(self, raw_spec: dict[str, Any],
                 catalog: Mapping[str, GpuType] = GPU_CATALOG,
                 refused: SpecError | None = None,
                 inherited: Mapping[str, str] = MappingProxyType({})) -> None:
        """`refused`: why the spec cannot run though it parses (a hub the platform does
        not list): the spec is then not parsed, so nothing renders from it. `inherited`:
        the fields of `raw_spec` the platform's defaults set, and where from."""
        self.catalog = catalog
        self.inherited = inherited
        self.runs = 0
        self.spec: GRPOJobSpec | None = None
        self.error: SpecError | None = refused
        if refused is not None:
            return
        try:
            self.spec = parse_spec(raw_spec)
        except SpecError as exc:
            self.error = exc

    def plan(self, attempts_before: list[AttemptRecord],
             model: PlanInput | None) -> JobPlan | Refused:
        """The plan of the attempt after `attempts_before` (planned)."""
        if self.spec is None:
            assert self.error is not None
            return Refused(Reason.INVALID_SPEC, self.error)
        self.runs += 1
        try:
            return JobPlan(self.spec, planned(self.spec, attempts_before, self.catalog, model),
                           self.inherited)
        except SpecError as exc:
            return Refused(Reason.INVALID_SPEC, exc)
        except (InfeasibleError, ValueError) as exc:
            return Refused(Reason.INFEASIBLE, exc)


def checked_plan(spec: GRPOJobSpec, catalog: Mapping[str, GpuType] = GPU_CATALOG,
                 model_config: dict[str, Any] | None = None,
                 model_source: str | None = None) -> Plan:
    """The first attempt's plan, checked as admission checks it (`grpo plan` too, so the
    two accept the same jobs): raises SpecError / InfeasibleError / ValueError.
    `model_source`: where `model_config` was read (grpo_api.model.shape.resolve_shape)."""
    try:
        plan = plan_memory(spec, catalog, model_config, model_source)
    except UnsupportedArchitecture as exc:
        raise SpecError([f"spec.model.path: {exc}"]) from None
    ours = [*plan.env, *(e["name"] for e in [*logging_env(spec), *store_env(spec)])]
    clashes = pod_settings.conflicts(spec.pods, ours)  # never override the operator's
    g = plan.geometry
    refused = [p for p in (image_problem(plan_network(g).fabrics, spec.image),
                           weight_sync_problem(g.shape.experts, g.rollout_engine,
                                               g.lora is not None)) if p]
    if clashes or refused:
        raise SpecError([*clashes, *refused])
    _check_trainer_config(spec, plan)
    return plan


# The trainer config is rendered per attempt for a job's own name; any name renders the
# same fields, so admission checks it under this one.
_ADMISSION_REF = JobRef("admission-check", "default", "")


def _check_trainer_config(spec: GRPOJobSpec, plan: Plan) -> None:
    """What the webhook admits, reconcile can render: the trainer config this spec and
    plan make must pass the trainer's own schema (a job the API server stores but whose
    config cannot be rendered would never get a status)."""
    try:
        trainer_config(spec, plan, _ADMISSION_REF)
    except ValidationError as exc:
        raise SpecError([_spec_problem(e["loc"], e["msg"]) for e in exc.errors()]) from None


def _spec_problem(loc: tuple[int | str, ...], msg: str) -> str:
    """A trainer config error as the spec fields a user changes: each config path in the
    location or the message names its spec field (grpo_api.job.trainer.SOURCES)."""
    where = ".".join(str(p) for p in loc)
    sources = config_sources()
    fields = [field for path, field in sources.items() if path == where or path in msg]
    named = ", ".join(dict.fromkeys(fields)) or "spec"
    return f"{named}: {msg.removeprefix('Value error, ')} (trainer config {where or 'check'})"


def backoff_seconds(spec: GRPOJobSpec, restarts: int) -> int:
    """Exponential, capped: initial x 2^restarts, at most max."""
    b = spec.recovery.backoff
    return int(min(b.initial_seconds * 2 ** restarts, b.max_seconds))
