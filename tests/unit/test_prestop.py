"""The worker pods' preStop hook asks the driver to stop (a drained pod's SIGTERM never
reaches it) and waits for the driver's done marker, which the driver writes at its end;
the operator renders the hook with the grace period's bound."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import Env, ExitCode
from grpo_api.job.status import GRPOJobStatus
from grpo_operator.planner.save_time import GRACE_EXTRA_S
from grpo_operator.reconcile.attempts import ensure_attempt
from grpo_operator.reconcile.planning import Planner
from grpo_operator.render import JobRef
from grpo_trainer.config import build_config
from grpo_trainer.liveness.prestop import attempt_files, main, wait_for_driver
from grpo_trainer.liveness.sigterm import TermSignal
from grpo_trainer.run import run_training

pytestmark = pytest.mark.unit
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class FakeClock:
    """Time that passes only when the hook sleeps (no real waiting in a unit test)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.on_sleep: list[Any] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for hook in self.on_sleep:
            hook(self.now)


def test_the_hook_returns_once_the_driver_is_done_and_not_before(tmp_path: Path) -> None:
    marker = tmp_path / "driver-done" / "u1-3"
    clock = FakeClock()
    clock.on_sleep.append(lambda t: t >= 42 and (marker.parent.mkdir(exist_ok=True),
                                                 marker.touch()))
    assert wait_for_driver(marker, 300, clock, clock.sleep) is True
    assert 42 <= clock.now < 44


def test_without_the_marker_the_hook_gives_up_at_its_timeout(tmp_path: Path) -> None:
    clock = FakeClock()
    assert wait_for_driver(tmp_path / "never", 338, clock, clock.sleep) is False
    assert clock.now == pytest.approx(338)


def test_the_driver_writes_the_marker_the_hook_of_its_attempt_waits_for(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that fails (here on a data file without one prompt, before Ray starts) still
    says it is done: the workers must not wait out their grace period for nothing."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(
        {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4}))
    data = tmp_path / "train.jsonl"
    data.write_text("not json\n")
    ckpt = tmp_path / "ckpt"
    env = {Env.CHECKPOINT_DIR.value: str(ckpt), Env.JOB_UID.value: "u1",
           Env.ATTEMPT.value: "3"}
    raw = {"model": {"path": str(model)}, "data": {"train_files": [str(data)]}}
    cfg = build_config(raw, [], environ=env)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    monkeypatch.setenv("GRPO_TERMINATION_LOG", str(tmp_path / "termination-log"))
    files = attempt_files(env)
    assert files is not None and not files.done.exists()
    code = run_training(str(path))
    assert code not in (ExitCode.FINISHED, ExitCode.CONFIG_ERROR)
    assert files.done.exists()
    assert attempt_files({}) is None  # outside a GRPOJob's pod: the hook returns at once


def test_a_drained_worker_pods_hook_asks_the_driver_to_stop_and_the_driver_does(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = {Env.CHECKPOINT_DIR.value: str(tmp_path), Env.JOB_UID.value: "u1",
           Env.ATTEMPT.value: "2", "HOSTNAME": "j-a2-cpu-worker-x7k2p"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    files = attempt_files(env)
    assert files is not None
    done, stop = files.done, files.stop
    term = TermSignal()
    term.watch(stop)
    try:
        assert main(["--timeout", "0"]) == 0  # the driver is not done: it gives up at once
        assert stop.read_text() == "j-a2-cpu-worker-x7k2p"
        deadline = time.monotonic() + 10
        while not term.requested and time.monotonic() < deadline:
            time.sleep(0.05)
        assert term.requested  # the driver saves and stops as on its own SIGTERM
    finally:
        term.restore()
    done.parent.mkdir(parents=True)
    done.touch()
    stop.unlink()
    assert main(["--timeout", "0"]) == 0
    assert not stop.exists()  # a driver already done is asked nothing


def test_worker_pods_wait_for_the_driver_within_their_grace_period() -> None:
    sp = yaml.safe_load((EXAMPLES / "grpojob-qwen2vl-72b-h100.yaml").read_text())["spec"]
    action = ensure_attempt(JobRef("j", "ns", "u1"), Planner(sp).plan([], None), GRPOJobStatus(),
                            "2026-11-21T10:00:00Z")
    rc = next(c for c in action.children if c["kind"] == "RayCluster")["spec"]
    worker = rc["workerGroupSpecs"][0]["template"]["spec"]
    grace = worker["terminationGracePeriodSeconds"]
    hook = worker["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert hook[-1] == (
        f"exec python -m grpo_trainer.liveness.prestop --timeout {grace - GRACE_EXTRA_S}")
    # The head runs the driver itself: no hook (its own SIGTERM starts the save).
    assert "lifecycle" not in rc["headGroupSpec"]["template"]["spec"]["containers"][0]
