"""Rollout randomness as pure functions of the seed, the step and the rank or prompt.

Nothing here depends on RNG history, so a resumed run samples what an unbroken one would
(the checkpoint records ``rollout_seed`` of the next step for every rank).
"""

from __future__ import annotations


def rollout_seed(base: int, step: int, rank: int) -> int:
    """Rollout randomness as a function of (seed, step, rank): resumable without RNG state."""
    return (base * 1_000_003 + step * 1009 + rank) % (2**31 - 1)


def prompt_seed(base: int, step: int, index: int) -> int:
    """One prompt's sampling seed (vLLM), from (seed, step, dataset index) only."""
    import numpy as np

    return int(np.random.SeedSequence([base, step, index]).generate_state(1)[0] >> 1)
