"""The stall probe across nodes: a rank on another node than the driver is dumped by a
zero-CPU Ray task pinned to its node (``ray.cluster_utils.Cluster``: two Ray nodes on
this machine), while the rank is busy in a method; once stopped it is named as silent.
And a driver stuck in its own code (never back in a Ray wait) is ended by the monitor."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grpo_api.contract import ExitCode
from grpo_trainer.liveness import stall_monitor
from grpo_trainer.liveness.stall import RankStacks, innermost_ours, parse_faulthandler
from grpo_trainer.liveness.stall_monitor import RankTarget, capture, install_stack_dump

pytestmark = pytest.mark.trainer


class BusyRank:
    """Stands in for a Worker: armed like one, then stuck in a method."""

    def arm(self) -> dict[str, Any]:
        import ray

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "stacks_file": install_stack_dump(1)}

    def stuck_in_a_collective(self, seconds: float) -> None:
        time.sleep(seconds)


@pytest.fixture(scope="module")
def two_nodes(local_ray_args: dict[str, Any]) -> Iterator[str]:
    """A two-node Ray; yields the non-head node's id."""
    import ray
    from ray.cluster_utils import Cluster

    was_local = ray.is_initialized()  # the tier's shared local Ray: back after this module
    if was_local:
        ray.shutdown()
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        ray.init(address=cluster.address)
        here = ray.get_runtime_context().get_node_id()
        (other,) = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != here]
        yield other
    finally:
        ray.shutdown()
        cluster.shutdown()
        if was_local:
            ray.init(**local_ray_args)


def test_a_rank_on_another_node_is_dumped_there_and_named_when_stopped(
    two_nodes: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    remote: Any = ray.remote(num_cpus=1)(BusyRank)
    rank = remote.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(two_nodes, soft=False)).remote()
    armed = ray.get(rank.arm.remote())
    assert armed["node_id"] == two_nodes != ray.get_runtime_context().get_node_id()
    target = RankTarget(1, armed["pid"], armed["node_id"], armed["stacks_file"])
    busy = rank.stuck_in_a_collective.remote(120.0)
    time.sleep(1.0)  # inside the method

    # Which ranks the driver's process dumps itself: none of another node's.
    in_driver: list[list[RankTarget]] = []
    dump_here = stall_monitor.dump_local

    def spy(targets: list[RankTarget], wait_s: float) -> list[RankStacks]:
        in_driver.append(list(targets))
        return dump_here(targets, wait_s)

    monkeypatch.setattr(stall_monitor, "dump_local", spy)
    (got,) = capture([target], wait_s=10.0)
    assert in_driver and not any(in_driver), in_driver
    assert got.rank == 1 and got.text is not None, got
    frame = innermost_ours(parse_faulthandler(got.text), os.path.dirname(__file__))
    assert frame is not None and frame.function == "stuck_in_a_collective", got.text

    os.kill(armed["pid"], signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        (silent,) = capture([target], wait_s=3.0)
        assert silent.text is None, silent
        assert time.monotonic() - t0 < 3.0 + 30.0
    finally:
        os.kill(armed["pid"], signal.SIGCONT)
        ray.kill(rank)
        del busy


STUCK_DRIVER = """
import logging, sys, time
from pathlib import Path
from grpo_trainer.liveness.stall import Heartbeat
from grpo_trainer.liveness.stall_monitor import StallMonitor
logging.basicConfig(level=logging.INFO)
beat = Heartbeat()
beat.mark("reward")
StallMonitor(beat, 1.0, [], Path(sys.argv[1]), 3, Path(sys.argv[2]), lambda: 7,
             force_exit_after_s=2.0).start()
def scoring_that_never_returns():
    time.sleep(120)
scoring_that_never_returns()
"""


def test_a_driver_stuck_outside_ray_is_ended_by_the_monitor_with_exit_6(tmp_path: Path) -> None:
    term = tmp_path / "termination-log"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", STUCK_DRIVER, str(tmp_path / "stalls"),
                           str(term)], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == ExitCode.HANG, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 50
    msg = json.loads(term.read_text())
    assert msg["reason"] == "Hang" and msg["lastCheckpointStep"] == 7
    assert "in stage reward: no rank is busy (the driver itself is stuck)" in msg["detail"]
    (stacks,) = (tmp_path / "stalls").glob("3-*.txt")
    assert "in scoring_that_never_returns" in stacks.read_text()  # the driver's own stack
