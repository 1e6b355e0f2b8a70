"""Reward functions, their forms (ours, EasyR1's, verl's, a judge's) and the parallel,
crash-tolerant runner (docs/rewards.md)."""

from .forms import Reward, RewardResult, extra_means, resolve_reward
from .runner import RewardRunner, reward_runner
from .sample import RewardRow, RewardSample, reward_rows, samples_for

__all__ = [
           "Reward",
           "RewardResult",
           "RewardRow",
           "RewardRunner",
           "RewardSample",
           "extra_means",
           "resolve_reward",
           "reward_rows",
           "reward_runner",
           "samples_for",
]
