"""Stall detection's pure half: the effective timeout, the frame named as "ours" in real
faulthandler dumps, the verdict's wording, the exit code, and the spec field's path."""

from __future__ import annotations

import faulthandler
import tempfile
import threading
from pathlib import Path

import pytest

from grpo_api.contract import STALL_TIMEOUT_S, ExitCode, FailureReason
from grpo_api.job import parse_spec
from grpo_operator.planner import plan_memory
from grpo_operator.render import JobRef
from grpo_operator.render.trainer_config import trainer_config
from grpo_testbed.examples import example_job
from grpo_trainer.errors import StepError, classify
from grpo_trainer.liveness.sigterm import Terminated
from grpo_trainer.liveness.stall import (
    PACKAGE_DIR,
    STALL_STEP_MULTIPLE,
    STALL_WARMUP_STEPS,
    Frame,
    RankStacks,
    StallError,
    ThreadStack,
    effective_timeout_s,
    innermost_ours,
    parse_faulthandler,
    report_text,
    verdict,
)

pytestmark = pytest.mark.unit

HERE = str(Path(__file__).resolve().parent)


def test_the_timeout_is_the_configured_one_until_steps_are_measured_after_warmup() -> None:
    warm = [500.0] * STALL_WARMUP_STEPS  # engine start, compilation: not measured
    assert effective_timeout_s(60.0, warm) == 60.0
    assert effective_timeout_s(60.0, [*warm, 10.0, 30.0, 20.0]) == STALL_STEP_MULTIPLE * 20.0
    # A configured timeout longer than the multiple wins.
    assert effective_timeout_s(1800.0, [*warm, 10.0, 30.0, 20.0]) == 1800.0


def stuck_in_a_data_loader(entered: threading.Event, release: threading.Event) -> None:
    entered.set()
    release.wait()


def _real_dump() -> str:
    """A real faulthandler dump of this process while a thread sits in
    ``stuck_in_a_data_loader`` (this file), under threading's own frames."""
    release, entered = threading.Event(), threading.Event()
    t = threading.Thread(target=stuck_in_a_data_loader, args=(entered, release))
    t.start()
    entered.wait()
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        text = f.read()
    release.set()
    t.join()
    return text


def test_a_real_dump_names_the_innermost_frame_of_ours_not_the_librarys() -> None:
    text = _real_dump()
    threads = parse_faulthandler(text)
    assert len(threads) >= 2 and sum(t.current for t in threads) == 1
    # The test's own thread (current) also runs code from this directory: the blocked
    # thread's frame is the one under threading.py's wait, as the dump shows it.
    blocked = [t for t in threads if any(f.function == "stuck_in_a_data_loader"
                                         for f in t.frames)]
    assert len(blocked) == 1
    inner = blocked[0].frames[0]
    assert inner.file.endswith("threading.py")  # innermost overall: the library's
    ours = innermost_ours(blocked, HERE)
    assert ours is not None and ours.function == "stuck_in_a_data_loader"
    assert ours.file == __file__ and ours.line > 0


def test_every_module_of_the_trainer_package_is_ours_not_only_the_liveness_ones() -> None:
    # A rank stuck in the update's backward waits in a frame of policy_update.py; with
    # only liveness/ counted as ours, the report said "no frame of the trainer".
    import grpo_trainer
    from grpo_trainer.rank import policy_update

    assert str(Path(grpo_trainer.__file__).resolve().parent) == PACKAGE_DIR
    update = Frame(str(Path(policy_update.__file__).resolve()), 10, "update")
    stuck = ThreadStack("0x1", (Frame("/lib/torch/distributed/c10d.py", 3, "reduce_scatter"),
                                update), current=True)
    assert innermost_ours([stuck]) == update


def test_the_main_threads_frame_wins_over_a_helper_threads() -> None:
    ours = f"{PACKAGE_DIR}/worker.py"
    helper = ThreadStack("0x1", (Frame(f"{PACKAGE_DIR}/rewards/runner.py", 9, "poll"),))
    main = ThreadStack("0x2", (Frame("/lib/torch/distributed/c10d.py", 3, "all_reduce"),
                               Frame(ours, 77, "update")), current=True)
    assert innermost_ours([helper, main]) == Frame(ours, 77, "update")
    assert innermost_ours([helper]) == helper.frames[0]


def test_a_silent_rank_is_named_before_a_busy_one() -> None:
    dump = f'Current thread 0x1 (most recent call first):\n  File "{PACKAGE_DIR}/worker.py"' \
           ', line 420 in update\n'
    stacks = [RankStacks(0, dump), RankStacks(1, None)]
    v = verdict(stacks, waiting=[0, 1], stage="update", idle_s=31, timeout_s=30,
                probe_timeout_s=10)
    assert v.rank == 1
    assert "rank 1 did not answer within 10 s" in v.message()
    native = "Thread 0x7f0cf41f96c0 (most recent call first):\n  <no Python frame>\n\n"
    text = report_text(v, stacks, native * 3 + dump)
    assert f"rank 0: {PACKAGE_DIR}/worker.py:420 update" in text
    assert "rank 1: did not answer within 10 s" in text
    idle = report_text(verdict(stacks, [1], "rollout", 31, 30, 10), stacks, "")
    assert "rank 0: idle (its call had returned)" in idle
    assert "<no Python frame>" not in text and "(and 3 threads with no Python frame)" in text
    both = verdict([RankStacks(0, dump)], waiting=[0], stage="update", idle_s=31,
                   timeout_s=30, probe_timeout_s=10)
    assert both.message().endswith(f"rank 0 is stuck at {PACKAGE_DIR}/worker.py:420 update")


def test_a_stall_exits_6_as_hang_and_sigterm_143_as_terminated() -> None:
    v = verdict([RankStacks(1, None)], [1], "rollout", 40, 30, 10)
    c = classify(StepError(3, StallError(v, Path("/ckpt/stalls/0-x.txt"))))
    assert (c.code, c.reason) == (ExitCode.HANG, FailureReason.HANG)
    assert "rank 1 did not answer" in c.detail and "/ckpt/stalls/0-x.txt" in c.detail
    c = classify(StepError(3, Terminated(3, True, 1.5)))
    assert (c.code, c.reason) == (ExitCode.TERMINATED, FailureReason.TERMINATED)
    assert c.code == 128 + 15


def test_the_spec_stall_timeout_reaches_the_trainer_config() -> None:
    spec = example_job()["spec"]
    parsed = parse_spec(spec)
    cfg = trainer_config(parsed, plan_memory(parsed), JobRef("j", "ns", "u"))
    assert cfg["trainer"]["stall_timeout_s"] == STALL_TIMEOUT_S
    spec = {**spec, "recovery": {**spec.get("recovery", {}), "stallTimeoutSeconds": 120}}
    parsed = parse_spec(spec)
    cfg = trainer_config(parsed, plan_memory(parsed), JobRef("j", "ns", "u"))
    assert cfg["trainer"]["stall_timeout_s"] == 120
