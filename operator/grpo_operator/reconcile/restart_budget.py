"""Which restart budget a failed attempt spends, and whether any is left (pure).

A job sets budgets per failure class (spec.recovery.restartBudgets, the classes in
grpo_api.job.recovery.RESTART_CLASSES); an attempt of a class with a budget counts toward
that budget only, every other toward backoffLimit, so a flaky node or a busy cluster does
not spend the restarts meant for a bug in the job's code. The counts come from the
attempts status keeps (each earlier attempt's outcome), so an operator restart loses none.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_api.contract import FailureReason
from grpo_api.job import GRPOJobSpec
from grpo_api.job.recovery import RESTART_CLASSES
from grpo_api.job.status import AttemptRecord

_CLASS_OF = {reason.value: name for name, reasons in RESTART_CLASSES.items()
             for reason in reasons}


def restart_class(outcome: str | None) -> str | None:
    """The restartBudgets key an attempt outcome counts toward; None: no class (Preempted,
    Succeeded, a permanent failure)."""
    return _CLASS_OF.get(str(outcome))


@dataclass(frozen=True)
class RestartBudget:
    """The budget a failure spends: a class's (`name`) or backoffLimit (None)."""

    name: str | None
    used: int  # restarts already spent from it
    limit: int

    @property
    def spent(self) -> bool:
        return self.used >= self.limit

    def words(self) -> str:
        """What the job's message adds: nothing for backoffLimit, as before budgets."""
        if self.name is None:
            return ""
        return (f" ({self.used} of them after {self.name} failures: "
                f"spec.recovery.restartBudgets.{self.name} is {self.limit})")


def restart_budget(spec: GRPOJobSpec, reason: FailureReason, earlier: list[AttemptRecord],
                   restarts: int) -> RestartBudget:
    """The budget an attempt that ended with `reason` spends. `earlier`: the attempts
    before it (status.attempts); `restarts`: status.restarts (preemptions not counted)."""
    budgets = spec.recovery.restart_budgets
    name = restart_class(reason.value)
    own = budgets.limit(name) if name is not None and spec.max_restarts else None
    if name is not None and own is not None:
        used = sum(1 for a in earlier if restart_class(a.outcome) == name)
        return RestartBudget(name, used, own)
    budgeted = sum(1 for a in earlier
                   if (c := restart_class(a.outcome)) is not None
                   and budgets.limit(c) is not None)
    return RestartBudget(None, restarts - budgeted, spec.max_restarts)
