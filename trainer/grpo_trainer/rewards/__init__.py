"""Reward functions and their parallel, crash-tolerant runner."""

from .runner import RewardResult, RewardRunner, resolve_reward_fn

__all__ = ["RewardResult", "RewardRunner", "resolve_reward_fn"]
