"""No silent hang, no lost step: real trainer processes (driver + 2 Ray rank actors).

A rank stopped with SIGSTOP is named within the stall timeout, its stacks file is on the
checkpoint directory and the run exits 6 (Hang); the next run resumes. SIGTERM to the
driver and every rank at once, between interval checkpoints, commits the last finished
step; the run after it starts there and ends bit-identical to an uninterrupted run.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from grpo_api.contract import ExitCode
from grpo_trainer.checkpointing.dcp import read_tracker
from grpo_trainer.checkpointing.export import load_model_tensors
from grpo_trainer.stall_monitor import DUMP_WAIT_S
from grpo_trainer.testing.configs import text_config
from grpo_trainer.testing.crash import step_metrics
from grpo_trainer.testing.datasets import write_text_task

pytestmark = pytest.mark.trainer

STALL_S = 20.0  # a tiny step takes a few seconds here, even on a loaded machine
_RANKS = re.compile(r"rank (\d+) pid (\d+) on node")


class Run:
    """``python -m grpo_trainer`` in a subprocess, stdout and stderr into one log."""

    def __init__(self, tmp: Path, name: str, cfg: dict[str, Any]) -> None:
        self.log = tmp / f"{name}.log"
        self.term = tmp / f"{name}.termination"
        config = tmp / f"{name}.yaml"
        config.write_text(yaml.safe_dump(cfg))
        env = {**os.environ, "GRPO_TERMINATION_LOG": str(self.term), "PYTHONUNBUFFERED": "1"}
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "grpo_trainer", "--config", str(config)],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )

    def text(self) -> str:
        return self.log.read_text()

    def wait_for(self, pattern: str, timeout: float = 300.0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if m := re.search(pattern, self.text()):
                return m
            assert self.proc.poll() is None, f"exited {self.proc.returncode}: {self.text()[-3000:]}"
            time.sleep(0.1)
        raise AssertionError(f"no {pattern!r} within {timeout} s: {self.text()[-3000:]}")

    def rank_pids(self) -> dict[int, int]:
        line = self.wait_for(r"ranks: .*").group(0)
        return {int(r): int(p) for r, p in _RANKS.findall(line)}

    def finished_steps(self) -> list[int]:
        return sorted(step_metrics(self.log))

    def wait(self, timeout: float = 300.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"still running after {timeout} s: {self.text()[-3000:]}") from None

    def message(self) -> dict[str, Any]:
        return dict(json.loads(self.term.read_text()))


def _config(model: Path, data: Path, ckpt: Path, steps: int, interval: int) -> dict[str, Any]:
    return text_config(model, data,
                       checkpoint={"dir": str(ckpt), "interval_steps": interval, "keep": 2},
                       trainer={"total_steps": steps, "stall_timeout_s": STALL_S})


def test_a_stopped_rank_is_named_within_the_timeout_and_the_next_run_resumes(
    tiny_lm: Path, tmp_path: Path
) -> None:
    data = write_text_task(tmp_path / "t.jsonl")
    ckpt = tmp_path / "ckpt"
    cfg = _config(tiny_lm, data, ckpt, steps=5, interval=1)
    run = Run(tmp_path, "stopped", cfg)
    pids = run.rank_pids()
    run.wait_for(r"checkpoint step 2 committed")
    os.kill(pids[1], signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        code = run.wait(STALL_S * 5 + 120)
    finally:
        with contextlib.suppress(ProcessLookupError):  # the run's Ray took it down
            os.kill(pids[1], signal.SIGCONT)
    detected_s = time.monotonic() - stopped
    text = run.text()
    assert code == ExitCode.HANG, text[-3000:]
    msg = run.message()
    assert msg["reason"] == "Hang"
    assert f"rank 1 did not answer within {DUMP_WAIT_S:.0f} s" in msg["detail"], msg
    (stacks,) = (ckpt / "stalls").glob("0-*.txt")
    assert str(stacks) in msg["detail"]
    report = stacks.read_text()
    assert report.startswith("no progress for ") and "rank 1 did not answer" in report
    # Rank 0 answered: its stack is there, down to the frame of ours it waits in.
    assert "=== rank 0 (most recent call first) ===" in report
    assert re.search(r"^rank 0: .*/grpo_trainer/\S+\.py:\d+ \w+", report, re.M), report[:2000]
    assert "STALL: " in text and "=== driver" in text  # the log has it too
    last = msg["lastCheckpointStep"]
    assert last is not None and last >= 2
    print(f"\nSIGSTOP of rank 1 -> exit 6 after {detected_s:.1f} s (stall timeout "
          f"{STALL_S:.0f} s, rank dump wait {DUMP_WAIT_S:.0f} s)")
    # Measured from the signal, so it includes the rest of the step that was under way.
    assert detected_s < STALL_S * 5 + 60

    again = Run(tmp_path, "after-stall", cfg)
    assert again.wait() == 0, again.text()[-3000:]
    assert f"resumed from checkpoint step {last} " in again.text()
    assert again.finished_steps() == list(range(last + 1, 6))


def _same_weights(a: Path, b: Path) -> None:
    ta, tb = load_model_tensors(a), load_model_tensors(b)
    assert ta.keys() == tb.keys()
    for k in ta:
        assert torch.equal(ta[k], tb[k]), k


def test_sigterm_to_every_process_mid_interval_loses_no_finished_step(
    tiny_lm: Path, tmp_path: Path
) -> None:
    data = write_text_task(tmp_path / "t.jsonl")
    # A tiny step takes a fraction of a second: the only interval save is step 10, and
    # SIGTERM comes soon after step 2.
    steps, interval = 12, 10
    ref = Run(tmp_path, "reference", _config(tiny_lm, data, tmp_path / "ref", steps, interval))
    assert ref.wait() == 0, ref.text()[-3000:]
    ref_metrics = step_metrics(ref.log)

    ckpt = tmp_path / "ckpt"
    cfg = _config(tiny_lm, data, ckpt, steps, interval)
    run = Run(tmp_path, "terminated", cfg)
    pids = run.rank_pids()
    run.wait_for(r'\{"step": 2[,}]')
    time.sleep(random.Random(30).uniform(0.0, 0.5))
    sent = time.monotonic()
    for pid in (run.proc.pid, *pids.values()):  # as when the RayCluster is deleted
        os.kill(pid, signal.SIGTERM)
    code = run.wait()
    stop_s = time.monotonic() - sent
    text = run.text()
    assert code == ExitCode.TERMINATED, text[-3000:]
    finished = run.finished_steps()
    last = finished[-1]
    assert 2 <= last < interval, finished  # mid-interval: no interval save had happened
    msg = run.message()
    assert msg["reason"] == "Terminated" and msg["lastCheckpointStep"] == last, msg
    tracker = read_tracker(ckpt)
    assert tracker is not None and tracker.step == last
    save_s = float(re.findall(r"checkpoint step \d+ committed: .* in ([0-9.]+) s", text)[-1])
    dropped = "the step is dropped" in text
    print(f"\nSIGTERM -> checkpoint of step {last} committed, exit 143 after {stop_s:.1f} s "
          f"(save {save_s:.2f} s; the step under way was "
          f"{'dropped (rollout)' if dropped else 'finished (update)'})")

    again = Run(tmp_path, "after-sigterm", cfg)
    assert again.wait() == 0, again.text()[-3000:]
    assert f"resumed from checkpoint step {last} " in again.text()
    resumed = step_metrics(again.log)
    assert sorted(resumed) == list(range(last + 1, steps + 1))
    for step, m in resumed.items():
        assert m == ref_metrics[step], f"step {step} differs from the uninterrupted run"
    _same_weights(ckpt / f"step-{steps}", tmp_path / "ref" / f"step-{steps}")
