"""A rollout's sampling settings and its samples, the same for a colocated rank
(worker.py) and a disaggregated engine (engine_actor.py): with engine ``e`` given rank
``e``'s prompts, the two sample alike."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from grpo_api.trainer_config import Config

from ..algorithm.samples import EncodedPrompt, Sample
from ..algorithm.seeds import prompt_seed, rollout_seed
from ..data import Record
from ..dataset import RowRef
from .base import Generation, SamplingSpec


def training_spec(cfg: Config, step: int, rank: int, records: Sequence[RowRef | Record],
                  suppress_ids: tuple[int, ...]) -> SamplingSpec:
    """``rollout.n`` samples per prompt, seeded from (seed, step, rank) and each prompt's
    (seed, step, index): a pure function of them (rollout/seeds.py)."""
    ro = cfg.rollout
    return SamplingSpec(
        n=ro.n,
        temperature=ro.temperature,
        top_p=ro.top_p,
        max_new_tokens=ro.max_new_tokens,
        seed=rollout_seed(ro.seed, step, rank),
        suppress_ids=suppress_ids,
        prompt_seeds=tuple(prompt_seed(ro.seed, step, r.index) for r in records),
    )


def greedy_spec(cfg: Config, step: int, rank: int, records: Sequence[RowRef | Record],
                suppress_ids: tuple[int, ...]) -> SamplingSpec:
    """Validation: one greedy response per prompt, with the training spec's seeds (they
    only matter to engines that draw even at temperature 0)."""
    return replace(training_spec(cfg, step, rank, records, suppress_ids),
                   n=1, temperature=0.0, top_p=1.0)


def to_samples(prompts: Sequence[EncodedPrompt], groups: Sequence[Sequence[Generation]],
               tokenizer: Any, version: int | None = None) -> list[Sample]:
    """Each prompt's generations as samples, in order; ``version``: the policy version
    that drew them (None: the policy being updated, colocated)."""
    out: list[Sample] = []
    for prompt, gens in zip(prompts, groups, strict=True):
        for g in gens:
            text = str(tokenizer.decode(g.token_ids, skip_special_tokens=True))
            out.append(Sample(prompt, g.token_ids, g.log_probs, g.finished, text,
                              policy_version=version))
    return out
