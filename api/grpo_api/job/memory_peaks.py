"""Memory peaks, planned and measured, in one shape: the plan's promise beside the trainer's
readings, and where a reading passes the promise.

The planner writes ``status.plan.peaks`` (planner/report.py), the trainer's driver
``status.progress.measuredPeaks`` (grpo_trainer.driver.measured_peaks), and the operator
sets the MemoryPlan condition from ``overruns`` (reconcile/conditions.py). The figures
compared are the ones both sides can name for the same thing:
- ``gpuGiB`` per rank stage (rollout, training): one GPU's peak, the plan's largest
  stage total within the rank stage (the planner's GPU_STAGES) against the worst rank's
  torch peak plus what the card holds outside torch (CUDA context, NCCL, cuBLAS);
- ``hostRankGiB``: one rank process, the plan's steady host terms of a node but the
  object store and the driver, over the node's ranks, against the largest rank's RSS;
- ``driverGiB``: the driver process where the plan counts it (a job whose ranks run on
  the head), against its RSS.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field

from ..contract import RankStage
from .base import ApiModel


class MemoryPeaks(ApiModel):
    """Peak memory, GiB: per GPU by rank stage, one rank process's and the driver's RSS."""

    gpu_gib: dict[str, float] = Field(
        default_factory=dict, alias="gpuGiB",
        description="One GPU's peak by rank stage (keys: rollout, training), GiB; empty on "
        "CPU ranks.")
    host_rank_gib: float | None = Field(
        None, ge=0, alias="hostRankGiB",
        description="One rank process's host memory in the steady state (RSS), GiB.")
    driver_gib: float | None = Field(
        None, ge=0, alias="driverGiB",
        description="The driver's host memory (RSS), GiB, where the plan counts it (ranks "
        "on the head).")


class MeasuredPeaks(MemoryPeaks):
    """The trainer's highest readings of this attempt, at step ends, over its ranks."""

    attempt: int = Field(0, ge=0, description="The attempt whose ranks measured them.")
    step: int = Field(0, ge=0, description="The step of the newest reading.")


# The rank stages a step-end reading covers (the load's peak is not read): wire keys.
MEASURED_GPU_STAGES = (RankStage.ROLLOUT.value, RankStage.TRAINING.value)


@dataclass(frozen=True)
class Overrun:
    """A measured peak above the plan's."""

    what: str  # "GPU rollout", "host per rank", "driver"
    planned_gib: float
    measured_gib: float

    def __format__(self, spec: str) -> str:
        """``f"{o:.1f}"``: the figures at that precision (a condition's message changes only
        when they do); ``str(o)``: two decimals."""
        f = spec or ".2f"
        over = self.measured_gib - self.planned_gib
        share = f" ({over / self.planned_gib:+.0%})" if self.planned_gib > 0 else ""
        return (f"{self.what}: measured {self.measured_gib:{f}} GiB, planned "
                f"{self.planned_gib:{f}} GiB, {over:{f}} GiB over{share}")

    def __str__(self) -> str:
        return format(self)


def _paired(planned: MemoryPeaks, measured: MeasuredPeaks) -> list[tuple[str, float, float]]:
    """(what, planned, measured) for each figure both name: the GPU stages, then the host."""
    pairs: list[tuple[str, float | None, float | None]] = [
        (f"GPU {stage}", planned.gpu_gib.get(stage), measured.gpu_gib.get(stage))
        for stage in MEASURED_GPU_STAGES]
    pairs += [("host per rank", planned.host_rank_gib, measured.host_rank_gib),
              ("driver", planned.driver_gib, measured.driver_gib)]
    return [(what, p, m) for what, p, m in pairs if p is not None and m is not None]


def overruns(planned: MemoryPeaks, measured: MeasuredPeaks) -> list[Overrun]:
    """Each figure both name where the measured one is above the planned one."""
    return [Overrun(what, p, m) for what, p, m in _paired(planned, measured) if m > p]


def compared(planned: MemoryPeaks, measured: MeasuredPeaks) -> list[str]:
    """The figures both name, as "what measured/planned GiB": the condition's message
    when nothing is over."""
    return [f"{what} {m:.2f}/{p:.2f}" for what, p, m in _paired(planned, measured)]
