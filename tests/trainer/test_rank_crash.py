"""A rank that dies inside a collective the ranks disagree on is a trainer error whose
message names the collective, not a lost node (liveness/rank_crash.py): real Ray actors,
a real gloo group, all-gathers of different sizes, gloo's own abort."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from grpo_api.contract import ExitCode, FailureReason
from grpo_testkit.collective_mismatch import MismatchedRank
from grpo_trainer.driver.worker_group import WorkerGroup
from grpo_trainer.errors import classify
from grpo_trainer.liveness.rank_crash import RankCrashed
from grpo_trainer.liveness.stall_monitor import RankTarget

pytestmark = pytest.mark.trainer


def _group(ranks: list[Any], armed: list[dict[str, Any]]) -> WorkerGroup:
    """A WorkerGroup over these actors (no gang, no trainer config): its ``call``."""
    group = object.__new__(WorkerGroup)
    group.workers = ranks
    group.targets = [RankTarget(r, a["pid"], a["node_id"], a["stacks_file"])
                     for r, a in enumerate(armed)]
    group.watch = None
    return group


def test_a_rank_aborted_in_a_mismatched_all_gather_is_a_trainer_error(
    ray_local: None,
) -> None:
    import ray

    remote: Any = ray.remote(num_cpus=0)(MismatchedRank)
    ranks = [remote.remote(r, 2) for r in range(2)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        ray.get([r.join.remote(port) for r in ranks])
        group = _group(ranks, ray.get([r.arm.remote() for r in ranks]))
        with pytest.raises(RankCrashed) as caught:
            group.call(MismatchedRank.gather, [8, 4096])
    finally:
        for r in ranks:
            ray.kill(r, no_restart=True)
    found = classify(caught.value)
    assert (found.code, found.reason) == (ExitCode.ERROR, FailureReason.ERROR)
    assert "collective all_gather_single" in found.detail, found.detail
    assert "Aborted" in found.detail and "not a lost node" in found.detail
    # What the driver classified before: the dead actor alone, a lost node.
    cause = caught.value.__cause__
    assert cause is not None
    assert classify(cause).reason is FailureReason.NODE_LOST
