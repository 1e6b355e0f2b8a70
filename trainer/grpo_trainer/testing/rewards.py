"""Reward functions for tests and demos, importable by path (``reward.function``)."""

from __future__ import annotations


def target_token_reward(response: str, ground_truth: str) -> dict[str, float]:
    """Dense, learnable reward: how often the response says ``ground_truth`` (capped at 4)."""
    hits = response.count(ground_truth)
    return {"overall": min(hits, 4) / 4.0, "accuracy": 1.0 if hits else 0.0}


def crashing_reward(response: str, ground_truth: str) -> float:
    """Raises on every other call pattern: exercises the per-sample failure path."""
    if len(response) % 2:
        raise RuntimeError("deliberate failure in a user reward function")
    return 0.5
