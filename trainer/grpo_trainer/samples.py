"""Encoded prompts, rollout samples, and the two collations (generation, training).

Multimodal inputs stay generic: processor outputs shaped like ``input_ids``
(e.g. Qwen's ``mm_token_type_ids``) are padded along with the tokens, everything
else (``pixel_values``, ``image_grid_thw``) is concatenated along dim 0 in sample
order, which is the layout Qwen-VL models expect for a batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .data import Record, build_messages, decode_images


@dataclass
class EncodedPrompt:
    record: Record
    input_ids: torch.Tensor  # [L] with image placeholders expanded
    token_extras: dict[str, torch.Tensor] = field(default_factory=dict)  # [L] each
    mm_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # concatenable on dim 0
    raw_prompt_ids: list[int] = field(default_factory=list)  # placeholders unexpanded (vLLM)
    images: list[Any] = field(default_factory=list)  # PIL images (vLLM)


@dataclass
class Sample:
    """One generation: a prompt, its response, and everything the update needs."""

    prompt: EncodedPrompt
    response_ids: torch.Tensor  # [R], up to and including EOS when it finished
    rollout_log_probs: torch.Tensor  # [R] from the rollout engine (diagnostic only)
    finished: bool
    text: str = ""
    old_log_probs: torch.Tensor | None = None  # recomputed by the actor
    ref_log_probs: torch.Tensor | None = None
    advantage: float = 0.0

    @property
    def num_tokens(self) -> int:
        return int(self.prompt.input_ids.numel() + self.response_ids.numel())


class PromptEncoder:
    """Chat template + processor, identical for rollout and training."""

    def __init__(
        self, processor: Any, tokenizer: Any, template: Any, image_size: dict[str, int] | None
    ):
        self.processor = processor
        self.tokenizer = tokenizer
        self.template = template
        self.image_size = image_size

    def encode(self, record: Record) -> EncodedPrompt:
        messages = build_messages(record, self.template)
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        raw_ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not record.images:
            ids = torch.tensor(raw_ids, dtype=torch.long)
            return EncodedPrompt(record, ids, raw_prompt_ids=list(raw_ids))
        if self.processor is None:
            raise ValueError("the model has no image processor but the data has images")
        images = decode_images(record.images)
        kwargs: dict[str, Any] = {}
        if self.image_size is not None:
            kwargs["size"] = self.image_size
        enc = self.processor(text=[text], images=images, return_tensors="pt", **kwargs)
        ids = enc["input_ids"][0]
        extras: dict[str, torch.Tensor] = {}
        mm: dict[str, torch.Tensor] = {}
        for key, value in enc.items():
            if key in ("input_ids", "attention_mask") or not isinstance(value, torch.Tensor):
                continue
            if value.dim() == 2 and value.shape == enc["input_ids"].shape:
                extras[key] = value[0]
            else:
                mm[key] = value
        return EncodedPrompt(record, ids, extras, mm, list(raw_ids), images)


def _concat_mm(prompts: list[EncodedPrompt]) -> dict[str, torch.Tensor]:
    keys = sorted({k for p in prompts for k in p.mm_inputs})
    return {k: torch.cat([p.mm_inputs[k] for p in prompts if k in p.mm_inputs]) for k in keys}


def collate_prompts(prompts: list[EncodedPrompt], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-padded prompt batch for ``generate``."""
    width = max(p.input_ids.numel() for p in prompts)
    b = len(prompts)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    extra_keys = sorted({k for p in prompts for k in p.token_extras})
    extras = {k: torch.zeros((b, width), dtype=torch.long) for k in extra_keys}
    for i, p in enumerate(prompts):
        n = p.input_ids.numel()
        ids[i, width - n :] = p.input_ids
        mask[i, width - n :] = 1
        for k in extra_keys:
            if k in p.token_extras:
                extras[k][i, width - n :] = p.token_extras[k]
    return {"input_ids": ids, "attention_mask": mask, **extras, **_concat_mm(prompts)}


@dataclass
class TrainBatch:
    model_inputs: dict[str, torch.Tensor]  # right-padded prompt+response
    labels: torch.Tensor  # [B, L-1] next-token targets
    response_mask: torch.Tensor  # [B, L-1] 1 where the target is a response token
    positions: list[tuple[int, int]]  # per sample (start in shifted space, length)

    def scatter(self, per_sample: list[torch.Tensor]) -> torch.Tensor:
        """Place per-sample response tensors into the [B, L-1] layout."""
        out = torch.zeros(self.labels.shape, dtype=torch.float32)
        for i, (start, n) in enumerate(self.positions):
            out[i, start : start + n] = per_sample[i].float()
        return out

    def gather(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Inverse of scatter: per-sample response slices of a [B, L-1] tensor."""
        return [values[i, s : s + n] for i, (s, n) in enumerate(self.positions)]


def collate_train(samples: list[Sample], pad_id: int) -> TrainBatch:
    """Right padding: position ids then equal plain offsets, as generation computed them
    from its left-padded attention mask, so recomputed log-probs line up."""
    lens = [s.num_tokens for s in samples]
    width = max(lens)
    b = len(samples)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    extra_keys = sorted({k for s in samples for k in s.prompt.token_extras})
    extras = {k: torch.zeros((b, width), dtype=torch.long) for k in extra_keys}
    positions: list[tuple[int, int]] = []
    for i, s in enumerate(samples):
        p = s.prompt.input_ids.numel()
        r = s.response_ids.numel()
        ids[i, :p] = s.prompt.input_ids
        ids[i, p : p + r] = s.response_ids
        mask[i, : p + r] = 1
        for k in extra_keys:
            if k in s.prompt.token_extras:
                extras[k][i, :p] = s.prompt.token_extras[k]
        positions.append((p - 1, r))
    labels = ids[:, 1:].clone()
    resp = torch.zeros((b, width - 1), dtype=torch.float32)
    for i, (start, n) in enumerate(positions):
        resp[i, start : start + n] = 1.0
    inputs = {
        "input_ids": ids,
        "attention_mask": mask,
        **extras,
        **_concat_mm([s.prompt for s in samples]),
    }
    return TrainBatch(inputs, labels, resp, positions)
