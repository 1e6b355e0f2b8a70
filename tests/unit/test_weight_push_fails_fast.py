"""A weight push fails fast when a member is lost (rollout/weight_bus.py).

On NCCL ``Work.wait()`` without a timeout returns at once and a broadcast to a lost
engine hangs until the watchdog crashes the process at the group's timeout (torch 2.13:
``include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp``, ``WorkNCCL::wait``;
``distributed/distributed_c10d.py``, ``_set_pg_timeout``). The CPU stand-in for that hang
is a gloo peer that is alive but never answers (SIGSTOPped): its connections stay open,
so nothing fails until a timeout does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

import pytest
import torch

from grpo_api.contract import WEIGHT_SYNC_BUCKET_BYTES
from grpo_trainer.rollout.weight_bus import (
    PUSH_FLOOR_BYTES_PER_S,
    PUSH_TIMEOUT_MIN_S,
    WeightGroupSpec,
    WeightSender,
    abandon,
    join_group,
    push_timeout_s,
    receive_weights,
)

pytestmark = pytest.mark.unit


def test_a_broadcast_may_take_its_bytes_at_the_floor_and_never_less_than_the_minimum(
) -> None:
    floor_bytes = int(PUSH_TIMEOUT_MIN_S * PUSH_FLOOR_BYTES_PER_S)
    # Headers and small buckets: the minimum (a new group's first collective builds it).
    assert push_timeout_s(8) == push_timeout_s(WEIGHT_SYNC_BUCKET_BYTES) == PUSH_TIMEOUT_MIN_S
    assert push_timeout_s(floor_bytes) == PUSH_TIMEOUT_MIN_S
    # Above it, the bytes at the floor: twice the bytes, twice the time.
    big = 4 * floor_bytes
    assert push_timeout_s(big) == big / PUSH_FLOOR_BYTES_PER_S
    assert push_timeout_s(2 * big) == 2 * push_timeout_s(big)
    assert push_timeout_s(big, minimum_s=1.0, floor_bytes_per_s=1e9) == max(1.0, big / 1e9)
    # Far below what NCCL's watchdog would wait (the group's timeout, 30 min or more).
    assert push_timeout_s(WEIGHT_SYNC_BUCKET_BYTES) < 30 * 60


HUNG_ENGINE = """
import sys, time
from grpo_trainer.rollout.weight_bus import WeightGroupSpec, join_group
spec = WeightGroupSpec("127.0.0.1", int(sys.argv[1]), "weights/1", 3, "gloo", 600, 2.0)
pg = join_group(spec, 2)
print("joined", flush=True)
time.sleep(600)
"""


def test_a_push_to_an_engine_that_hangs_ends_at_its_timeout_not_the_groups() -> None:
    """An engine alive but stuck (as a lost peer looks to NCCL): rank 0's push and the
    other engine's receive each give up at the push's timeout (here a 2 s minimum) and
    abandon the group, where they would wait out the group's 600 s; the driver then
    replaces the engine (engine_group.EngineGroup.push)."""
    sender = WeightSender(0)
    port = sender.open(timeout_s=600)
    spec = WeightGroupSpec("127.0.0.1", port, "weights/1", 3, "gloo", 600, 2.0)
    hung = subprocess.Popen([sys.executable, "-c", HUNG_ENGINE, str(port)],
                            stdout=subprocess.PIPE, text=True)
    outcome: list[object] = []
    report: list[dict[str, Any]] = []

    def survivor() -> None:
        pg = join_group(spec, 1)
        try:
            outcome.append(len(list(receive_weights(pg, torch.device("cpu"), 2.0))))
        except Exception as err:  # its wait ran out, or rank 0 dropped the group
            outcome.append(err)

    def rank0() -> None:
        sender.join(spec)
        report.append(sender.push(iter([("w", torch.ones(1000))] * 3)))

    threads = [threading.Thread(target=survivor, daemon=True),
               threading.Thread(target=rank0, daemon=True)]
    try:
        for t in threads:
            t.start()
        assert hung.stdout is not None and hung.stdout.readline().strip() == "joined"
        os.kill(hung.pid, signal.SIGSTOP)  # alive, connected, silent
        for t in threads:
            t.join(timeout=120)  # far below the group's 600 s
        assert not any(t.is_alive() for t in threads), "a member waits out the group"
        assert report and not report[0]["ok"], report
        assert "timed out" in report[0]["error"].lower(), report
        assert sender.pg is None  # abandoned: the group is formed again for everyone
        assert outcome and isinstance(outcome[0], Exception), outcome
    finally:
        hung.kill()


class _Group:
    def __init__(self) -> None:
        self.aborted = 0

    def abort(self) -> None:
        self.aborted += 1


def test_a_broken_push_aborts_an_nccl_group_and_leaves_a_gloo_one_to_close() -> None:
    """NCCL: ``abort`` (ncclCommAbort) ends the broadcast still queued on the member's
    GPU; without it the stream stays blocked and the watchdog crashes the process at the
    group's timeout (ProcessGroupNCCL.hpp, ``ErrorHandlingMode``: the default tears the
    process down). gloo: the op already ended with its own timeout, and dropping the
    group closes its connections, where ``abort`` would leave the peers waiting
    (test_weight_bus.py)."""
    nccl, gloo = _Group(), _Group()
    abandon(nccl, torch.device("cuda", 0))  # type: ignore[arg-type]
    abandon(gloo, torch.device("cpu"))  # type: ignore[arg-type]
    assert (nccl.aborted, gloo.aborted) == (1, 0)
