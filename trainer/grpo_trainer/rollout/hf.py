"""Rollouts with transformers ``generate`` on an unsharded copy of the policy.

For CPUs and tests. Each rank keeps its own compute-dtype copy and refreshes it
parameter by parameter from the FSDP shards every step; generating straight from
the FSDP module would all-gather every layer for every token, which on gloo costs
far more than one gather per step. The vLLM engine is the path for large models.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from ..grpo_math import log_probs_from_logits
from ..samples import EncodedPrompt, collate_prompts
from .base import Generation, SamplingSpec


class HFGenerateEngine:
    def __init__(self, model: Any, pad_id: int, eos_ids: list[int]) -> None:
        self.model = model.eval()
        self.model.requires_grad_(False)
        self.pad_id = pad_id
        self.eos_ids = eos_ids
        self._params = dict(self.model.named_parameters())

    def wake(self) -> None:
        return None

    def sleep(self) -> None:
        return None

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        for name, tensor in weights:
            self._params[name].copy_(tensor)

    @torch.no_grad()
    def generate(self, prompts: list[EncodedPrompt], spec: SamplingSpec) -> list[list[Generation]]:
        repeated = [p for p in prompts for _ in range(spec.n)]
        batch = collate_prompts(repeated, self.pad_id)
        width = batch["input_ids"].shape[1]
        # generate draws from the global RNG; seeding it here makes a step's rollouts
        # a function of (seed, step, rank) alone, which exact resume relies on.
        torch.manual_seed(spec.seed)
        out = self.model.generate(
            **batch,
            do_sample=True,
            temperature=spec.temperature,
            top_p=spec.top_p,
            top_k=0,
            max_new_tokens=spec.max_new_tokens,
            eos_token_id=self.eos_ids,
            suppress_tokens=list(spec.suppress_ids) or None,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        seqs = out.sequences[:, width:]
        # Raw logits / temperature: the distribution the actor recomputes (top-p aside).
        logits = torch.stack(out.logits, dim=1).float() / spec.temperature
        logps = log_probs_from_logits(logits, seqs)
        eos = torch.tensor(self.eos_ids)
        gens: list[Generation] = []
        for i in range(seqs.shape[0]):
            is_eos = torch.isin(seqs[i], eos).nonzero()
            finished = is_eos.numel() > 0
            length = int(is_eos[0, 0]) + 1 if finished else seqs.shape[1]
            gens.append(Generation(seqs[i, :length].clone(), logps[i, :length].clone(), finished))
        return [gens[i * spec.n : (i + 1) * spec.n] for i in range(len(prompts))]
