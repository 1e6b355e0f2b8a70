"""The memory planner: pure functions from (spec, GPU catalog[, config.json]) to a Plan."""

from __future__ import annotations

from grpo_api.model.families import SUPPORTED, UnsupportedArchitecture, family_of
from grpo_api.model.shape import KNOWN_MODELS, Shape, shape_from_config

from .core import plan_memory
from .ladder import LADDERS, next_safer_plan, remediation_ladder
from .report import plan_status, plan_to_dict
from .save_time import termination_grace_s
from .types import Budget, Decision, Geometry, InfeasibleError, Plan, PodResources, Settings

__all__ = [
    "KNOWN_MODELS",
    "LADDERS",
    "SUPPORTED",
    "Budget",
    "Decision",
    "Geometry",
    "InfeasibleError",
    "Plan",
    "PodResources",
    "Settings",
    "Shape",
    "UnsupportedArchitecture",
    "family_of",
    "next_safer_plan",
    "plan_memory",
    "plan_status",
    "plan_to_dict",
    "remediation_ladder",
    "shape_from_config",
    "termination_grace_s",
]
