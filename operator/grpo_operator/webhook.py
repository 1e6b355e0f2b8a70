"""Admission: refuse invalid or infeasible jobs at `kubectl apply` time, with the
planner's numbers, and refuse changes to fields that cannot change mid-job."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import kopf

from grpo_api.catalog import GPU_CATALOG, GpuType
from grpo_api.contract import API_GROUP, API_VERSION, PLURAL
from grpo_api.job import SpecError, parse_spec

from .config import from_memo
from .planner import InfeasibleError
from .reconcile import planned

# What a running job is: changing these would make its checkpoints meaningless.
# memory, restartPolicy, image and suspend may change; they apply at the next attempt.
IMMUTABLE_SECTIONS = ("model", "data", "reward", "algorithm", "training", "resources",
                      "checkpoint")


def admission_problem(spec: dict[str, Any], old_spec: dict[str, Any] | None,
                      catalog: Mapping[str, GpuType] = GPU_CATALOG) -> str | None:
    """Why the API server should refuse this spec, or None (pure)."""
    if old_spec is not None and old_spec == spec:
        return None  # metadata/finalizer updates must never be blocked by a newer planner
    if old_spec is not None:
        changed = [k for k in IMMUTABLE_SECTIONS if old_spec.get(k) != spec.get(k)]
        if changed:
            return (f"spec.{', spec.'.join(changed)} cannot change after the job is created "
                    "(checkpoints depend on them); create a new GRPOJob instead. "
                    "spec.memory, spec.restartPolicy, spec.image and spec.suspend may change "
                    "and take effect at the next attempt")
    try:
        planned(spec, catalog=catalog)
    except SpecError as exc:
        return str(exc)
    except (InfeasibleError, ValueError) as exc:
        return f"the memory planner refuses this job: {exc}"
    return None


def admission_warnings(spec: dict[str, Any]) -> list[str]:
    """What kubectl should print beside an accepted spec: deprecated fields set (pure)."""
    try:
        return parse_spec(spec).deprecation_warnings()
    except SpecError:
        return []  # refused anyway, with its own message


@kopf.on.validate(API_GROUP, API_VERSION, PLURAL, id="validate-grpojob")
def grpojob_validate(spec: kopf.Spec, memo: kopf.Memo, warnings: list[str],
                     old: kopf.Body | None = None, operation: str | None = None,
                     **_: Any) -> None:
    old_spec = dict(old.get("spec") or {}) if operation == "UPDATE" and old else None
    problem = admission_problem(dict(spec), old_spec, from_memo(memo).catalog)
    if problem:
        raise kopf.AdmissionError(problem, code=422)
    warnings.extend(admission_warnings(dict(spec)))


@kopf.on.mutate(API_GROUP, API_VERSION, PLURAL, id="default-grpojob", operations=["CREATE"])
def grpojob_default(spec: kopf.Spec, patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
    """Record the trainer image a job runs, so an operator upgrade does not change it."""
    if not spec.get("image"):
        patch.spec["image"] = from_memo(memo).default_image
