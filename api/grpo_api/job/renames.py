"""Old field names of GRPOJob.spec, still accepted: each moves to its new name when the
spec is parsed, and admission warns naming both (kubectl prints it).

The API stays v1alpha1 and renames in place rather than serving a v1alpha2 beside it:
a conversion webhook would make every read of every GRPOJob (kubectl get, the
operator's own watch, Kueue's) depend on the operator's webhook being up, and an alpha
API's users gain nothing from two stored shapes. The old fields stay in the CRD's
schema (described as deprecated, naming their replacement) so old manifests apply
unchanged; the operator reads only the new ones. docs/configuration.md, "Renamed
fields", lists them.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

RESTART_ON_FAILURE = "OnFailure"
RESTART_NEVER = "Never"


@dataclass(frozen=True)
class Rename:
    old: str  # dotted wire path under spec
    new: str


RENAMES: tuple[Rename, ...] = (
    Rename("resources.gpu", "resources.gpuType"),
    # One section for the algorithm (spec.algorithm), one for the schedule (spec.training):
    # spec.trainer's EasyR1-style settings moved to where they belong.
    Rename("trainer.formatPrompt", "data.promptTemplate"),
    Rename("trainer.entropyCoef", "algorithm.entropyCoef"),
    Rename("trainer.clipRatioDual", "algorithm.clipRatioDual"),
    Rename("trainer.offpolicyIsCap", "algorithm.offpolicyIsCap"),
    Rename("trainer.klEstimator", "algorithm.klEstimator"),
    Rename("trainer.normAdvByStd", "algorithm.normAdvByStd"),
    Rename("trainer.ppoEpochs", "algorithm.ppoEpochs"),
    Rename("trainer.warmupSteps", "training.warmupSteps"),
    Rename("trainer.valBeforeTrain", "training.valBeforeTrain"),
    Rename("trainer.rewardTimeoutSeconds", "reward.timeoutSeconds"),
    Rename("trainer.rewardWorkers", "reward.workers"),
    # Kubernetes' words for restarts: restartPolicy a string, backoffLimit a count.
    Rename("restartPolicy.maxRestarts", "backoffLimit"),
    Rename("restartPolicy.backoff", "recovery.backoff"),
    Rename("restartPolicy.stallTimeoutSeconds", "recovery.stallTimeoutSeconds"),
    Rename("restartPolicy.remediate", "recovery.remediate"),
    Rename("restartPolicy.allowPrecisionChange", "recovery.allowPrecisionChange"),
)
RENAMED_TO: Mapping[str, str] = {r.old: r.new for r in RENAMES}


class RenameConflict(ValueError):
    """An old name and its new one both set, to different values."""


def _get(tree: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = tree
    for key in path.split("."):
        if not isinstance(node, Mapping) or key not in node:
            return False, None
        node = node[key]
    return True, node


def _pop(tree: dict[str, Any], path: str) -> None:
    *parents, last = path.split(".")
    node = tree
    for key in parents:
        node = node[key]
    node.pop(last)
    if parents and not node:  # an emptied old section goes too
        _pop(tree, ".".join(parents))


def _put(tree: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = tree
    for key in parents:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[last] = value


def old_names_used(raw_spec: Mapping[str, Any]) -> list[Rename]:
    """The renamed fields this (wire, camelCase) spec sets by their old names."""
    return [r for r in RENAMES if _get(raw_spec, r.old)[0]]


def with_new_names(raw_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The spec with every old name moved to its new one (a copy); an old and a new name
    both set to different values is a RenameConflict naming both. An old restartPolicy
    object becomes restartPolicy OnFailure (it could not say Never)."""
    out = copy.deepcopy(dict(raw_spec))
    for r in RENAMES:
        found, value = _get(out, r.old)
        if not found:
            continue
        there, current = _get(out, r.new)
        if there and current != value:
            raise RenameConflict(f"{r.old} is the old name of {r.new}, and both are set "
                                 f"({value!r} and {current!r}): keep {r.new} only")
        _pop(out, r.old)
        _put(out, r.new, value)
    left = out.get("restartPolicy")
    if isinstance(left, Mapping):
        if left:  # a key the old object never had: refused as the old schema refused it
            raise RenameConflict(f"restartPolicy.{next(iter(left))}: unknown field "
                                 "(restartPolicy is OnFailure or Never; restarts are "
                                 "backoffLimit, their settings spec.recovery)")
        out["restartPolicy"] = RESTART_ON_FAILURE
    elif "restartPolicy" not in out and isinstance(raw_spec.get("restartPolicy"), Mapping):
        out["restartPolicy"] = RESTART_ON_FAILURE
    return out


def rename_warnings(raw_spec: Mapping[str, Any]) -> list[str]:
    """What admission warns about a spec written with old names: each old name and its
    new one."""
    return [f"spec.{r.old} is renamed: write spec.{r.new} (the old name still works, for "
            "now)" for r in old_names_used(raw_spec)]
