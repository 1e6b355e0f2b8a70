"""Two drivers of different attempts on one checkpoint directory, for real (one in-process
gloo rank each, the real save path): once attempt 1 has claimed the directory, attempt 0's
save in flight is not committed, attempt 0 cannot start a save, and a late attempt-0
driver refuses to start; attempt 1 goes on and commits.

The save in flight meets attempt 1 in one of two ways, and both are run: its files are
already on disk (the commit is refused), or they are still being written when attempt 1's
start-up removes the uncommitted directory (the write fails, and the failure is reported
as superseded, not as a broken save). The second is held open with an event on the real
file system's stream, since which comes first is otherwise up to the machine's speed."""

from __future__ import annotations

import threading
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from grpo_testkit.configs import text_config
from grpo_testkit.crash import LocalGroup
from grpo_testkit.datasets import write_text_task
from grpo_trainer.checkpointing.dcp import DCPCheckpointer, read_tracker, scan
from grpo_trainer.checkpointing.fence import AttemptSupersededError, read_fence
from grpo_trainer.checkpointing.rank import HashingFileSystem
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.rank.worker import Worker

pytestmark = pytest.mark.trainer


def _hold_writes(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[threading.Event, threading.Event, threading.Event]:
    """(armed, holding, release): while ``armed`` is set, every file DCP opens for
    writing sets ``holding`` and waits for ``release`` first (on DCP's writer thread).
    DCP creates the step directory before it opens a file, so once ``holding`` is set
    the directory exists and the write has not begun."""
    armed, holding, release = threading.Event(), threading.Event(), threading.Event()
    real = HashingFileSystem.create_stream

    @contextmanager
    def held(self: HashingFileSystem, path: Any, mode: str) -> Generator[Any, None, None]:
        if "w" in mode and armed.is_set():
            holding.set()
            assert release.wait(120), "the test never released the held write"
        with real(self, path, mode) as stream:
            yield stream

    monkeypatch.setattr(HashingFileSystem, "create_stream", held)
    return armed, holding, release


@pytest.mark.parametrize("in_flight", ["written", "being_written"])
def test_an_older_attempt_never_commits_after_a_newer_one_claimed_the_dir(
    tiny_lm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_flight: str
) -> None:
    armed, holding, release = _hold_writes(monkeypatch)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)  # the in-process ranks set them; undone after
    ckpt = tmp_path / "ckpt"
    raw = text_config(
        tiny_lm,
        write_text_task(tmp_path / "t.jsonl"),
        resources={"num_workers": 1},
        checkpoint={"dir": str(ckpt), "interval_steps": 1, "async_save": True},
        trainer={"total_steps": 4},
    )

    def driver(attempt: int) -> GRPOTrainer:
        cfg = build_config(raw, environ={"GRPO_ATTEMPT": str(attempt)})
        return GRPOTrainer(cfg, checkpointer=DCPCheckpointer(cfg))

    old, new = driver(0), driver(1)
    groups = [LocalGroup(old.cfg), LocalGroup(new.cfg)]
    try:
        old.group = groups[0]  # type: ignore[assignment]
        old.step = old.checkpointer.restore(old.group, old.loader)
        assert read_fence(ckpt) == 0
        old.train_step()
        old.checkpointer.maybe_save(1, old.group, old.loader, final=True)  # committed
        old.train_step()
        if in_flight == "being_written":
            armed.set()
        old.checkpointer.maybe_save(2, old.group, old.loader, final=False)  # in flight
        if in_flight == "written":
            groups[0].call(Worker.finish_checkpoint, common=[True])  # on disk, not committed
        else:  # otherwise attempt 1 may remove the directory before DCP creates it again
            assert holding.wait(60), "attempt 0's save never opened a file"
        assert read_tracker(ckpt).step == 1  # type: ignore[union-attr]

        # Attempt 1 starts while attempt 0's step-2 save is not committed.
        new.group = groups[1]  # type: ignore[assignment]
        new.step = new.checkpointer.restore(new.group, new.loader)
        assert new.step == 1 and read_fence(ckpt) == 1
        release.set()  # a held write now finds its directory gone
        with pytest.raises(AttemptSupersededError, match="not committing checkpoint step 2"):
            old.checkpointer.wait(old.group)  # type: ignore[attr-defined]
        assert read_tracker(ckpt).step == 1  # type: ignore[union-attr]
        assert not scan(ckpt).get(2)  # never marked complete

        new.train_step()
        new.checkpointer.maybe_save(2, new.group, new.loader, final=True)
        assert read_tracker(ckpt).step == 2  # type: ignore[union-attr]
        assert scan(ckpt) == {1: True, 2: True}

        # Attempt 2 claims on the first rank (its failed save was reported once: the load
        # must not fail on it); attempt 1 may not even start a save now.
        newest = driver(2)
        assert newest.checkpointer.restore(groups[0], newest.loader) == 2
        new.train_step()
        with pytest.raises(AttemptSupersededError, match="not saving checkpoint step 3"):
            new.checkpointer.maybe_save(3, new.group, new.loader, final=True)
        assert scan(ckpt) == {1: True, 2: True}

        late = driver(0)
        with pytest.raises(AttemptSupersededError, match="attempt 0 is superseded: attempt 2"):
            late.checkpointer.restore(groups[0], late.loader)
        assert scan(ckpt) == {1: True, 2: True} and read_fence(ckpt) == 2
    finally:
        release.set()
        for trainer in (old, new):
            trainer.group = None
            trainer.close()
        groups[0].shutdown()  # the two in-process ranks share one process group
