"""Reward functions for tests, importable by path (``reward.function``). The demo's
reward ships with the product: ``grpo_trainer.rewards.mentions``."""

from __future__ import annotations


def crashing_reward(response: str, ground_truth: str) -> float:
    """Raises on every other call pattern: exercises the per-sample failure path."""
    if len(response) % 2:
        raise RuntimeError("deliberate failure in a user reward function")
    return 0.5
