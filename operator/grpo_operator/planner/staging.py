"""The disk a Ray pod stages checkpoints on when its job has no claim (pure).

spec.checkpoint.store without claimName or size: each pod's ``/checkpoints`` is its own
disk (an emptyDir, the node's ephemeral storage), and the pod requests what it will
write there, so the scheduler places it on a node with room instead of the kubelet
evicting it under disk pressure in the middle of a save. What a pod holds at most:

- its ranks' share of one checkpoint (a save waits for the previous upload, whose staged
  files are dropped once they are up; the plan's ``checkpoint_rank_gib`` per rank);
- on the pod that runs rank 0, at the end, the final export: the whole checkpoint fetched
  from the store, and the exported model beside it (no larger than the checkpoint);
- the attempt's logs, the data index and the driver's mirror of the store's small files.
"""

from __future__ import annotations

import math

from .types import Plan

# Logs, the data index (40 bytes a row: 40 MB for a million rows), the mirrored manifests.
STAGING_EXTRA_GIB = 2


def staging_gib(plan: Plan, ranks: int, exports: bool) -> int:
    """GiB of ephemeral storage a pod with ``ranks`` ranks requests; ``exports``: the
    pod may run rank 0, which exports the final model."""
    b, g = plan.budget, plan.geometry
    share = b.checkpoint_rank_gib * ranks
    export = 2 * b.checkpoint_rank_gib * g.world_size if exports else 0.0
    return math.ceil(share + export + STAGING_EXTRA_GIB)


def pod_staging_gib(plan: Plan) -> dict[str, int]:
    """The request of each Ray pod of the plan, by its template's name (head, rank0,
    worker, rollout). Rank 0 runs on its own pod when the plan has one, else on any
    training worker pod (which one is Ray's choice); on the head when it runs the ranks."""
    g = plan.geometry
    ranks_on_head = g.nodes == 0
    out = {"head": staging_gib(plan, g.ranks_per_node if ranks_on_head else 0,
                               exports=ranks_on_head)}
    if plan.rank0 is not None:
        out["rank0"] = staging_gib(plan, g.ranks_per_node, exports=True)
    if plan.worker is not None:
        out["worker"] = staging_gib(plan, g.ranks_per_node, exports=plan.rank0 is None)
    if plan.rollout is not None:
        out["rollout"] = staging_gib(plan, 0, exports=False)
    return out
