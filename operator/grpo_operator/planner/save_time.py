"""The Ray pods' SIGTERM grace period, from the checkpoint save it must cover (pure).

On SIGTERM (a preemption, a drain, suspend) the trainer commits a checkpoint of its last
finished step before it exits; the kubelet kills the pods once
terminationGracePeriodSeconds pass, so that period must hold the save. Before any save,
it is predicted from what a rank writes (the plan's checkpointed state) at a
conservative write rate; once a save happened, the trainer's measured
status.progress.saveSeconds replaces the prediction (from the next attempt on: a pod's
grace period cannot change while it runs).
"""

from __future__ import annotations

import math

from .types import Plan

# GiB/s one node writes to the checkpoint claim: a shared filesystem (NFS, a cloud
# file store) gives a node a few hundred MB/s to about 1 GB/s; the low end, since a
# grace period too short loses the save, one too long only delays a drain.
SAVE_GIB_PER_S = 0.5
# Each rank writes its own shard, so the save takes as long as one node's ranks need:
# this many seconds on top for the commit (a rename and a marker file) and for the
# driver to get out of the Ray call it is in.
SAVE_FIXED_S = 20.0
# x the (predicted or measured) save time: saves vary with the filesystem's load.
GRACE_MARGIN = 1.5
# Ray's own shutdown after the save, and the kubelet's SIGKILL latency.
GRACE_EXTRA_S = 30
# Kubernetes' default is 30 s; ours is never below a minute (the commit alone may need
# that on a loaded filesystem) nor above an hour (a drain must end).
GRACE_MIN_S = 60
GRACE_MAX_S = 3600


def prestop_timeout_s(grace_s: int) -> int:
    """How long a worker's preStop hook waits for the driver's done marker: the grace
    period less Ray's own shutdown (the hook counts against the grace period)."""
    return max(grace_s - GRACE_EXTRA_S, 1)


def predicted_save_s(plan: Plan) -> float:
    """Seconds one save takes: the ranks of one node write their shards at once."""
    per_node = plan.budget.checkpoint_rank_gib * plan.geometry.ranks_per_node
    return SAVE_FIXED_S + per_node / SAVE_GIB_PER_S


def termination_grace_s(plan: Plan, measured_save_s: float | None = None) -> int:
    """terminationGracePeriodSeconds of the head and worker pods: the measured save
    (status.progress.saveSeconds) if there is one, else the predicted, x GRACE_MARGIN
    plus GRACE_EXTRA_S, within [GRACE_MIN_S, GRACE_MAX_S]."""
    save = measured_save_s if measured_save_s is not None and measured_save_s > 0 \
        else predicted_save_s(plan)
    grace = math.ceil(GRACE_MARGIN * save + GRACE_EXTRA_S)
    return min(max(grace, GRACE_MIN_S), GRACE_MAX_S)
