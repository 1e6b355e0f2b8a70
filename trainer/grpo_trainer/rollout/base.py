"""The rollout-engine interface the worker drives once per step."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch

from ..algorithm.samples import EncodedPrompt


@dataclass(frozen=True)
class SamplingSpec:
    n: int
    temperature: float  # 0: greedy (validation passes)
    top_p: float
    max_new_tokens: int
    seed: int  # derived per step and rank by the worker, so rollouts are reproducible
    # Never sampled: image/video placeholders in a response would be taken for
    # vision inputs by the training forward (feature/token count mismatch).
    suppress_ids: tuple[int, ...] = ()
    # One seed per prompt (vLLM): a prompt's samples then depend on the prompt and
    # step only, not on which rank or tensor-parallel layout generated them.
    prompt_seeds: tuple[int, ...] = ()


@dataclass
class Generation:
    token_ids: torch.Tensor  # [R], EOS included when the sequence finished
    log_probs: torch.Tensor  # [R], log p under the engine's sampling distribution
    finished: bool


class RolloutEngine(Protocol):
    """Lifecycle per step: ``wake`` -> ``load_weights`` -> ``generate`` -> ``sleep``.

    ``load_weights`` receives (name, full tensor) pairs one parameter at a time, in
    Hugging Face naming, so no engine ever needs the whole model gathered at once.
    """

    def wake(self) -> None: ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def generate(self, prompts: list[EncodedPrompt], spec: SamplingSpec) -> list[list[Generation]]:
        """``spec.n`` generations for each prompt, in prompt order."""
        ...

    def sleep(self) -> None: ...
