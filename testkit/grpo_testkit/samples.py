"""Rollout samples for the update's tests: random response tokens after encoded prompts."""

from __future__ import annotations

from typing import Any

import torch

from grpo_trainer.algorithm.samples import Sample


def random_samples(prompts: list[Any], lengths: list[list[int]], seed: int = 0) -> list[Sample]:
    """Each prompt's samples with responses of ``lengths`` tokens (ids from 10 up: the
    special tokens, the image pad among them, are below), in order; a group's samples
    share their encoded prompt, as a rollout leaves them."""
    gen = torch.Generator().manual_seed(seed)
    return [
        Sample(p, torch.randint(10, 300, (n,), generator=gen), torch.zeros(n), True)
        for p, ns in zip(prompts, lengths, strict=True)
        for n in ns
    ]
