"""The update's shared-prefix attention by segment instead of under one dense mask.

A packed row (algorithm/packing.py) is a prompt then n responses, each response seeing
the prompt and its own earlier tokens. Under a dense [rows, 1, W, W] mask (W = P + sum R)
SDPA computes every query against every key and masks most of them away: the responses
cost W^2 where they need sum R (P + R). Here a layer's attention is SDPA on the same
q/k/v in parts: the prompts, causal on their own ([rows, P_max]), then the responses,
each response's queries gathered into a slot against its row's prompt keys and its own
keys ([responses, R] x [responses, packed_width(P_max + R)], under a small additive
mask), one call per group of similar lengths (R its longest: ``length_buckets``). Every
call is transformers' own ``sdpa_attention_forward`` (its GQA handling, its kernel
choice), so on a GPU they take SDPA's flash kernel (the causal prompt, no mask) and its
memory-efficient kernel (the responses' mask, last dimension a multiple of 8 as that
kernel wants, grpo_api.contract.PACKED_WIDTH_ALIGNMENT).

The layout is made once per micro-batch (``segment_layout``) and reaches every layer as a
keyword argument of the model's forward (transformers passes a forward's extra keywords to
its attention function); the ``attention_mask`` the model sees is the segment ids as a
[rows, 1, 1, W] integer tensor, which transformers' mask builder hands through as it is
(an "already prepared" 4-D mask) and which SDPA would refuse if it ever reached it. A
forward without a layout (the padded layout, the hf engine's decode) is plain sdpa.

The results are the dense mask's up to float rounding (tests/trainer/test_segment_attention.py).
The trainer uses the segment layout where it takes less memory than the dense mask
(``segments_pay``; the byte counts are grpo_api.contract's), so the planner's bound is
the lesser of the two layouts' worst cases (planner/layout.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from grpo_api.contract import dense_mask_bytes, packed_width, segment_layout_bytes

# The attention implementation's name in transformers' registry: sdpa, plus segments.
SEGMENT_ATTENTION = "grpo_sdpa_segments"


@dataclass(frozen=True)
class SlotGroup:
    """Responses of similar lengths (``length_buckets``) in slots of the longest of them,
    R, indexing the flat ``[rows * W]`` token axis: ``slot_query`` [N, R] and
    ``slot_keys`` [N, S] (a padded slot points at a real token and is masked); ``mask``
    [N, 1, R, S] is additive in the compute dtype; ``slots`` [M] are the places of the
    group's M response tokens in the flattened ``slot_query`` (their flat positions are
    the layout's ``queries``, group after group)."""

    slot_query: torch.Tensor
    slot_keys: torch.Tensor
    mask: torch.Tensor
    slots: torch.Tensor

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.slot_query, self.slot_keys, self.mask, self.slots

    def to(self, device: torch.device | str) -> SlotGroup:
        return SlotGroup(*(t.to(device) for t in self.tensors()))


@dataclass(frozen=True)
class SegmentLayout:
    """A packed micro-batch's attention by segment: the prompts' causal SDPA over the
    rows' first ``prompt_width`` tokens, then one SDPA per group of responses.
    ``queries`` [M] are the flat positions of every response token, the groups' in their
    order: made once here, so each layer writes the groups' results in one index_put."""

    prompt_width: int  # P_max
    groups: tuple[SlotGroup, ...]
    queries: torch.Tensor

    def to(self, device: torch.device | str) -> SegmentLayout:
        return replace(self, groups=tuple(g.to(device) for g in self.groups),
                       queries=self.queries.to(device))

    @property
    def nbytes(self) -> int:
        """What the layout holds on the device (the segment ids beside it are the
        batch's ``attention_mask``)."""
        return self.queries.nbytes + sum(t.nbytes for g in self.groups for t in g.tensors())


def length_buckets(lengths: list[int]) -> list[list[int]]:
    """Indices of ``lengths``, longest first, cut where a length is half its group's
    longest or less: every slot then holds more than half real tokens, so one long
    response beside many short ones pads only its own group."""
    out: list[list[int]] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if out and 2 * lengths[i] > lengths[out[-1][0]]:
            out[-1].append(i)
        else:
            out.append([i])
    return out


def length_slots(lengths: list[int]) -> list[tuple[int, int]]:
    """(responses, longest) of each group, as grpo_api.contract counts them."""
    return [(len(b), lengths[b[0]]) for b in length_buckets(lengths)]


def segments_pay(
    width: int, prompts: list[int], responses: list[int], dtype: torch.dtype
) -> bool:
    """Whether rows ``width`` wide with ``prompts`` tokens each and ``responses`` (their
    lengths, all > 0) take less memory by segment than under the dense mask
    (grpo_api.contract's counts): in a row of a few tokens (a short prompt, a few short
    responses) the slots' int64 gathers can outweigh its small dense mask."""
    if not responses:
        return False
    size = dtype.itemsize
    by_segment = segment_layout_bytes(len(prompts) * width, length_slots(responses),
                                      sum(responses), max(prompts), size)
    return by_segment < dense_mask_bytes(len(prompts), width, size)


def segment_layout(
    prompts: list[int], responses: list[tuple[int, int, int]], width: int,
    mask_dtype: torch.dtype, device: torch.device | str | None = None,
) -> SegmentLayout:
    """The layout of rows ``width`` wide whose prompts have ``prompts`` tokens each and
    whose responses are (row, first column, length); every response has >= 1 token. Made
    on ``device`` from the few integers above (the host makes none of the mask)."""
    p_max = max(prompts)
    buckets = length_buckets([r for _, _, r in responses])
    made = [
        _slot_group(prompts, [responses[i] for i in b], width, p_max, mask_dtype, device)
        for b in buckets]
    return SegmentLayout(prompt_width=p_max, groups=tuple(g for g, _ in made),
                         queries=torch.cat([q for _, q in made]))


def _slot_group(
    prompts: list[int], responses: list[tuple[int, int, int]], width: int, p_max: int,
    mask_dtype: torch.dtype, device: torch.device | str | None,
) -> tuple[SlotGroup, torch.Tensor]:
    """One group's slots, and the flat positions of its response tokens."""
    n = len(responses)
    r_max = max(r for _, _, r in responses)
    keys_width = packed_width(p_max + r_max)

    def ints(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    row = ints([b for b, _, _ in responses])
    start = ints([c for _, c, _ in responses])
    length = ints([r for _, _, r in responses])
    prompt_len = ints(prompts)[row]
    i = torch.arange(r_max, device=device)
    # A padded query slot repeats the response's last token (masked out of the result).
    slot_query = row[:, None] * width + start[:, None] + torch.minimum(i, length[:, None] - 1)
    j = torch.arange(keys_width, device=device)
    own = j - p_max  # the key's place in the response, for the columns after P_max
    in_prompt = j < p_max
    key_col = torch.where(in_prompt[None], j[None].expand(n, -1),
                          start[:, None] + own.clamp(0)[None].minimum(length[:, None] - 1))
    allowed = (j[None, None, :] < prompt_len[:, None, None]) | (
        ~in_prompt[None, None, :]
        & (own[None, None, :] <= i[None, :, None])
        & (own[None, None, :] < length[:, None, None])
    )
    valid = i[None, :] < length[:, None]  # [N, R_max]
    mask = torch.zeros(allowed.shape, dtype=mask_dtype, device=device).masked_fill_(
        allowed.logical_not_(), torch.finfo(mask_dtype).min)[:, None]
    group = SlotGroup(
        slot_query=slot_query,
        slot_keys=row[:, None] * width + key_col,
        mask=mask,
        slots=torch.arange(n * r_max, device=device).view(n, r_max)[valid],
    )
    return group, slot_query[valid]


def _flat(x: torch.Tensor) -> torch.Tensor:
    """[B, H, L, D] -> [B * L, H, D]."""
    b, h, length, d = x.shape
    return x.transpose(1, 2).reshape(b * length, h, d)


def segment_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
    segment_layout: SegmentLayout | None = None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-function contract: q [B, H, L, D], k/v [B, Hkv, L, D] ->
    ([B, L, H, D], None). By segment with a layout, else sdpa unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if segment_layout is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    lay = segment_layout
    kwargs.pop("is_causal", None)
    b, h, length, d = query.shape
    p = lay.prompt_width
    prompt_out, _ = sdpa_attention_forward(
        module, query[:, :, :p], key[:, :, :p], value[:, :, :p], None,
        dropout=dropout, scaling=scaling, is_causal=True, **kwargs)
    # Prompt columns from the first call, response tokens from the groups'; pads 0.
    out = torch.cat([prompt_out, prompt_out.new_zeros(b, length - p, h, d)], dim=1)
    flat_q, flat_k, flat_v = _flat(query), _flat(key), _flat(value)
    picked = []
    for g in lay.groups:
        n, r_max = g.slot_query.shape
        q = flat_q[g.slot_query].transpose(1, 2)  # [N, H, R, D]
        k = flat_k[g.slot_keys].transpose(1, 2)  # [N, Hkv, S, D]
        v = flat_v[g.slot_keys].transpose(1, 2)
        resp_out, _ = sdpa_attention_forward(module, q, k, v, g.mask,
                                             dropout=dropout, scaling=scaling, **kwargs)
        picked.append(resp_out.reshape(n * r_max, h, d)[g.slots])
    # One write of every group's tokens (their places are disjoint), not a copy of the
    # whole output per group.
    out = out.reshape(b * length, h, d).index_put((lay.queries,), torch.cat(picked))
    return out.view(b, length, h, d), None


def register() -> None:
    """Make ``SEGMENT_ATTENTION`` a transformers attention implementation whose masks
    (for forwards without a layout) are sdpa's. Idempotent."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(SEGMENT_ATTENTION, segment_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(SEGMENT_ATTENTION, sdpa_mask)


def install(model: nn.Module) -> bool:
    """Run ``model``'s language-model attention by segment where it is sdpa (an eager
    model keeps the dense mask); True when it does. The vision tower keeps its own."""
    config: Any = getattr(model, "config", None)
    if config is None:
        return False
    text = config.get_text_config()
    if text._attn_implementation not in ("sdpa", SEGMENT_ATTENTION):
        return False
    register()
    # The text config alone: the top config's setter would pass it on to the vision
    # tower's, which gets the forward's keywords too (Qwen2.5-VL's get_image_features).
    text._attn_implementation = SEGMENT_ATTENTION
    return True


def installed(model: nn.Module) -> bool:
    config: Any = getattr(model, "config", None)
    return config is not None and config.get_text_config()._attn_implementation == (
        SEGMENT_ATTENTION)
