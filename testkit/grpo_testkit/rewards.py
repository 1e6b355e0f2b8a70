"""Reward functions for tests, importable by path (``reward.function``). The demo's
reward ships with the product: ``grpo_trainer.rewards.mentions``."""

from __future__ import annotations

import os
import time
from pathlib import Path

from grpo_trainer.checkpointing.dcp import read_tracker
from grpo_trainer.rewards.mentions import mentions_answer

HOLD_CHECKPOINTS = "GRPO_TEST_HOLD_AFTER_CHECKPOINT"  # a checkpoint root
HOLD_RELEASE = "GRPO_TEST_HOLD_RELEASE"  # a file: the hold ends once it exists
HOLD_LIMIT_S = 120.0


def crashing_reward(response: str, ground_truth: str) -> float:
    """Raises on every other call pattern: exercises the per-sample failure path."""
    if len(response) % 2:
        raise RuntimeError("deliberate failure in a user reward function")
    return 0.5


def reward_held_after_a_checkpoint(response: str, ground_truth: str) -> dict[str, float]:
    """The demo's reward, held from the first committed checkpoint until the release file
    exists. A test that removes a node in that window knows the step after the commit
    cannot finish before the node is gone, however fast the machine is (the rewards are
    scored on the driver between the ranks' rollouts and their update)."""
    if read_tracker(Path(os.environ[HOLD_CHECKPOINTS])) is not None:
        release, deadline = Path(os.environ[HOLD_RELEASE]), time.monotonic() + HOLD_LIMIT_S
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    return mentions_answer(response, ground_truth)


KILL_PID_FILE = "GRPO_TEST_KILL_PID_FILE"  # a file holding a pid: killed at the next scoring


def reward_killing_a_process(response: str, ground_truth: str) -> dict[str, float]:
    """The demo's reward; the first scoring after a test wrote a pid into the file named
    by ``KILL_PID_FILE`` SIGKILLs that process (once: the file is claimed by renaming).
    The rewards are scored on the driver after the rollout and before the update, so a
    rollout engine killed here dies between its batch and the next weight push."""
    path = os.environ.get(KILL_PID_FILE)
    if path:
        claimed = f"{path}.claimed"
        try:
            os.rename(path, claimed)
        except FileNotFoundError:
            pass
        else:
            os.kill(int(Path(claimed).read_text()), 9)
    return mentions_answer(response, ground_truth)
