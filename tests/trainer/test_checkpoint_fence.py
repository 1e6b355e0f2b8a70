"""Two drivers of different attempts on one checkpoint directory, for real (one in-process
gloo rank each, the real save path): once attempt 1 has claimed the directory, attempt 0's
save in flight is not committed, attempt 0 cannot start a save, and a late attempt-0
driver refuses to start; attempt 1 goes on and commits."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_trainer.checkpointing.dcp import DCPCheckpointer, read_tracker, scan
from grpo_trainer.checkpointing.fence import AttemptSupersededError, read_fence
from grpo_trainer.config import build_config
from grpo_trainer.driver import GRPOTrainer
from grpo_trainer.testing.configs import text_config
from grpo_trainer.testing.crash import LocalGroup
from grpo_trainer.testing.datasets import write_text_task

pytestmark = pytest.mark.trainer


def test_an_older_attempt_never_commits_after_a_newer_one_claimed_the_dir(
    tiny_lm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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
        old.checkpointer.maybe_save(2, old.group, old.loader, final=False)  # in flight
        assert read_tracker(ckpt).step == 1  # type: ignore[union-attr]

        # Attempt 1 starts while attempt 0's step-2 save is still being written.
        new.group = groups[1]  # type: ignore[assignment]
        new.step = new.checkpointer.restore(new.group, new.loader)
        assert new.step == 1 and read_fence(ckpt) == 1
        with pytest.raises(AttemptSupersededError, match="not committing checkpoint step 2"):
            old.checkpointer.wait(old.group)  # type: ignore[attr-defined]
        assert read_tracker(ckpt).step == 1  # type: ignore[union-attr]
        assert not scan(ckpt).get(2)  # never marked complete

        new.train_step()
        new.checkpointer.maybe_save(2, new.group, new.loader, final=True)
        assert read_tracker(ckpt).step == 2  # type: ignore[union-attr]
        assert scan(ckpt) == {1: True, 2: True}

        # Attempt 2 claims (on the first rank); attempt 1 may not even start a save now.
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
        for trainer in (old, new):
            trainer.group = None
            trainer.close()
        groups[0].shutdown()  # the two in-process ranks share one process group
