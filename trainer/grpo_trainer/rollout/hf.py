"""Rollouts with transformers ``generate`` on an unsharded copy of the policy.

For CPUs and tests. Each rank keeps its own compute-dtype copy and refreshes it
parameter by parameter from the FSDP shards every step; generating straight from
the FSDP module would all-gather every layer for every token, which on gloo costs
far more than one gather per step. The vLLM engine is the path for large models.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from transformers.cache_utils import DynamicLayer

from ..algorithm.grpo_math import log_probs_from_logits
from ..algorithm.samples import EncodedPrompt, collate_prompts
from .base import Generation, SamplingSpec
from .lean_decode import LeanDecoder, supports

log = logging.getLogger(__name__)


class HFGenerateEngine:
    def __init__(
        self, model: Any, pad_id: int, eos_ids: list[int], sampler: str = "native"
    ) -> None:
        self.sampler = sampler
        self.is_vlm = getattr(model.config, "vision_config", None) is not None
        self.model = model.eval()
        self.model.requires_grad_(False)
        self.pad_id = pad_id
        self.eos_ids = eos_ids
        # Decode steps without the module stack where the architecture allows; checked
        # against the model's own forward on the first step (see _decode).
        self.lean: LeanDecoder | None = None
        if sampler == "native" and supports(self.model):
            self.lean = LeanDecoder(self.model)
        self._lean_checked = False
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
        device = next(self.model.parameters()).device
        if self.sampler == "native":
            batch = collate_prompts(prompts, self.pad_id)
            seqs, logps = self._sample({k: v.to(device) for k, v in batch.items()}, spec)
        else:
            repeated = [p for p in prompts for _ in range(spec.n)]
            batch = collate_prompts(repeated, self.pad_id)
            seqs, logps = self._generate({k: v.to(device) for k, v in batch.items()}, spec)
        seqs, logps = seqs.cpu(), logps.cpu()
        eos = torch.tensor(self.eos_ids)
        gens: list[Generation] = []
        for i in range(seqs.shape[0]):
            is_eos = torch.isin(seqs[i], eos).nonzero()
            finished = is_eos.numel() > 0
            length = int(is_eos[0, 0]) + 1 if finished else seqs.shape[1]
            gens.append(Generation(seqs[i, :length].clone(), logps[i, :length].clone(), finished))
        return [gens[i * spec.n : (i + 1) * spec.n] for i in range(len(prompts))]

    def _generate(
        self, batch: dict[str, torch.Tensor], spec: SamplingSpec
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """transformers ``generate``: the reference sampler."""
        width = batch["input_ids"].shape[1]
        # generate draws from the global RNG; seeding it here makes a step's rollouts
        # a function of (seed, step, rank) alone, which exact resume relies on.
        torch.manual_seed(spec.seed)
        greedy = spec.temperature == 0
        sampling = {} if greedy else {"temperature": spec.temperature, "top_p": spec.top_p}
        out = self.model.generate(
            **batch,
            do_sample=not greedy,
            **sampling,
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
        logits = torch.stack(out.logits, dim=1).float() / (spec.temperature or 1.0)
        return seqs, log_probs_from_logits(logits, seqs)

    def _sample(
        self, prompt_batch: dict[str, torch.Tensor], spec: SamplingSpec
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A lean KV-cached sampling loop: same distribution as ``generate``, a fraction of
        its cost on small models on CPUs, where per-token overhead dominates.

        Each prompt is prefilled once and its KV cache copied to its ``spec.n`` rows (the
        n responses of a group share the prompt); the cache grows in preallocated
        buffers instead of being concatenated every token; the decode mask is kept as a
        ready 4-D mask, so the model builds none per token.
        """
        from transformers import DynamicCache

        model, n = self.model, spec.n
        ids, mask = prompt_batch["input_ids"], prompt_batch["attention_mask"]
        extra = {k: v for k, v in prompt_batch.items() if k not in ("input_ids", "attention_mask")}
        width = ids.shape[1]
        b = ids.shape[0] * n
        gen = torch.Generator(device=ids.device).manual_seed(spec.seed)
        cache = DynamicCache(config=model.config)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        deltas = torch.zeros(b, 1, dtype=torch.long, device=ids.device)
        if self.is_vlm:
            # The model derives multimodal (M-RoPE) positions and remembers their offset.
            # A batch without images or videos derives none and would leave the offset of
            # the model's previous batch (transformers' Qwen*VLModel.compute_3d_position_ids
            # keeps rope_deltas unless it can recompute them): a text-only prompt after a
            # video one would decode at that prompt's offset, and a resumed run differently.
            inner = getattr(model, "model", None)
            if inner is not None and hasattr(inner, "rope_deltas"):
                inner.rope_deltas = None
            out = model(
                input_ids=ids,
                attention_mask=mask,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
                **extra,
            )
            found = getattr(getattr(model, "model", None), "rope_deltas", None)
            if found is not None:
                deltas = found.repeat_interleave(n, dim=0)
        else:
            out = model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        capacity = width + spec.max_new_tokens
        cache.layers = [_GrowingLayer(layer, n, capacity) for layer in cache.layers]
        # [B, 1, 1, capacity], additive (a boolean mask is converted in every attention
        # call): 0 where a query may attend (prompt tokens, then every generated
        # position; a finished row's pad tokens only feed that row), else the minimum.
        dtype = self.model.dtype  # the queries'
        attend = torch.zeros(b, 1, 1, capacity, dtype=dtype, device=ids.device)
        padding = mask.repeat_interleave(n, dim=0) == 0
        attend[:, 0, 0, :width].masked_fill_(padding, torch.finfo(dtype).min)
        next_pos = pos[:, -1:].repeat_interleave(n, dim=0) + 1
        logits = out.logits[:, -1].float().repeat_interleave(n, dim=0)
        eos = torch.tensor(self.eos_ids, device=ids.device)
        suppress = list(spec.suppress_ids)
        done = torch.zeros(b, dtype=torch.bool, device=ids.device)
        tokens: list[torch.Tensor] = []
        logps: list[torch.Tensor] = []
        greedy = spec.temperature == 0  # validation: the argmax, log-probs at temperature 1
        for t in range(spec.max_new_tokens):
            logits = logits / (spec.temperature or 1.0)
            logp_all = torch.log_softmax(logits, dim=-1)
            sample_logits = logits
            if suppress:
                sample_logits = sample_logits.clone()
                sample_logits[:, suppress] = float("-inf")
            if spec.top_p < 1.0:
                sample_logits = _top_p(sample_logits, spec.top_p)
            if greedy:
                nxt = sample_logits.argmax(dim=-1)
            else:
                probs = torch.softmax(sample_logits, dim=-1)
                nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            nxt = torch.where(done, torch.full_like(nxt, self.pad_id), nxt)
            tokens.append(nxt)
            logps.append(logp_all.gather(1, nxt[:, None]).squeeze(1))
            done = done | torch.isin(nxt, eos)
            if bool(done.all()) or t == spec.max_new_tokens - 1:
                break
            if self.is_vlm:
                position_ids = (next_pos + deltas).unsqueeze(0).expand(3, b, 1)
            else:
                position_ids = next_pos
            logits = self._decode(nxt, position_ids, cache, attend[..., : width + t + 1])
            next_pos = next_pos + 1
        return torch.stack(tokens, dim=1), torch.stack(logps, dim=1)

    def _decode(
        self, nxt: torch.Tensor, position_ids: torch.Tensor, cache: Any, attend: torch.Tensor
    ) -> torch.Tensor:
        """Logits for one new token per row, appended to ``cache``."""
        lean = self.lean
        # A VLM's decode positions are M-RoPE's [3, B, 1], one text position in each.
        text_pos = position_ids[0] if position_ids.dim() == 3 else position_ids
        if lean is not None and self._lean_checked:
            return lean.step(nxt, text_pos, cache.layers, attend).float()
        logits = self._model_step(nxt, position_ids, cache, attend)
        if lean is None:
            return logits
        # First use: the lean step must reproduce the model's forward, or it is dropped.
        # When it passes, its own logits and keys/values are what this step keeps, so a
        # process that starts mid-run (a resume) samples exactly like one that did not.
        for layer in cache.layers:
            layer.rewind(1)
        ours = lean.step(nxt, text_pos, cache.layers, attend).float()
        self._lean_checked = True
        tol = 1e-3 if ours.dtype == logits.dtype == torch.float32 else 5e-2
        err = float((ours - logits).abs().max())
        if err <= tol * (1.0 + float(logits.abs().max())) and bool(torch.isfinite(ours).all()):
            return ours
        log.warning("lean decode step differs from the model by %.3g: not used", err)
        self.lean = None
        for layer in cache.layers:
            layer.rewind(1)
        return self._model_step(nxt, position_ids, cache, attend)

    def _model_step(
        self, nxt: torch.Tensor, position_ids: torch.Tensor, cache: Any, attend: torch.Tensor
    ) -> torch.Tensor:
        out = self.model(
            input_ids=nxt[:, None],
            attention_mask=attend,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
        )
        logits: torch.Tensor = out.logits[:, -1].float()
        return logits


class _GrowingLayer(DynamicLayer):
    """A KV-cache layer in buffers sized for the whole generation: appending a token
    writes in place, where ``DynamicLayer`` concatenates (copies) the whole cache for
    every token. Built from a prefilled layer, each row repeated ``repeats`` times."""

    def __init__(self, prefilled: Any, repeats: int, capacity: int) -> None:
        super().__init__()
        keys = prefilled.keys.repeat_interleave(repeats, dim=0)
        values = prefilled.values.repeat_interleave(repeats, dim=0)
        b, h, length, _ = keys.shape
        self._keys = keys.new_empty(b, h, capacity, keys.shape[-1])
        self._values = values.new_empty(b, h, capacity, values.shape[-1])
        self._keys[:, :, :length] = keys
        self._values[:, :, :length] = values
        self._length = length
        self.keys = self._keys[:, :, :length]
        self.values = self._values[:, :, :length]
        self.dtype, self.device = keys.dtype, keys.device
        self.is_initialized = True

    def rewind(self, tokens: int) -> None:
        self._length -= tokens
        self.keys = self._keys[:, :, : self._length]
        self.values = self._values[:, :, : self._length]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        start = self._length
        end = start + key_states.shape[-2]
        self._keys[:, :, start:end] = key_states
        self._values[:, :, start:end] = value_states
        self._length = end
        self.keys = self._keys[:, :, :end]
        self.values = self._values[:, :, :end]
        return self._keys[:, :, :end], self._values[:, :, :end]


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of tokens whose probability reaches ``top_p``."""
    sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
    cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
    drop = cum - torch.softmax(sorted_logits, dim=-1) > top_p
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)
