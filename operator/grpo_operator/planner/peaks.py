"""The plan's peaks in the shape the trainer measures (grpo_api.job.memory_peaks): what
status.plan.peaks promises and the MemoryPlan condition holds the readings to."""

from __future__ import annotations

from grpo_api.contract import RankStage
from grpo_api.job.memory_peaks import MEASURED_GPU_STAGES, MemoryPeaks

from .types import GPU_STAGES, Plan

# Host terms of a node that are no rank process's: Ray's object store (shared memory of
# the raylet) and the driver (the head's process, where the ranks run on the head).
NOT_A_RANK = ("ray_object_store", "driver")


def planned_peaks(plan: Plan) -> MemoryPeaks:
    """Per GPU: each measured rank stage's largest stage total (a rank goes through all of
    them, the peak is the largest); per rank process: the node's steady host terms but
    NOT_A_RANK, over its ranks (every other term is ranks x one rank's part)."""
    g, b = plan.geometry, plan.budget
    gpu = {}
    for stage in MEASURED_GPU_STAGES:
        totals = [sum(b.gpu_stages[name].values())
                  for name in GPU_STAGES[RankStage(stage)] if name in b.gpu_stages]
        if totals:
            gpu[stage] = round(max(totals), 2)
    ranks = g.ranks_per_node
    rank_gib = sum(v for k, v in b.host_terms.items() if k not in NOT_A_RANK) / ranks \
        if ranks else None
    driver = b.host_terms.get("driver")
    return MemoryPeaks.model_validate({
        "gpuGiB": gpu, "hostRankGiB": round(rank_gib, 2) if rank_gib is not None else None,
        "driverGiB": round(driver, 2) if driver is not None else None})
