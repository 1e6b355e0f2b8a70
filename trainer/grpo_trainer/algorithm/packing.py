"""The update's shared-prefix layout: each group's prompt once per row, image included,
then its responses, under a 4-D attention mask in which every response sees the prompt
and its own earlier tokens only, at the positions it had in generation.

A group of n responses to a P-token prompt then costs P + sum(R) tokens of forward and
backward instead of n * P + sum(R), and the vision tower encodes each image once
instead of n times; the log-probs and gradients are those of the padded layout
(``samples.collate_train``) up to float rounding (tests/trainer/test_shared_prefix.py).
Text models take 1-D positions (``arange``);
Qwen2/2.5/3-VL take their M-RoPE positions ([3, rows, width]), which the model's own
``get_rope_index`` computes from each unpacked sample (``rope_index_of``): the model
recomputes none when it is given ``position_ids``, so the packed rows get exactly the
positions the padded forward would have computed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from grpo_api.contract import packed_width

from ..model.segment_attention import segment_layout, segments_pay
from .samples import Sample, TrainBatch, concat_mm

# An unpacked sample's [3, P + R] M-RoPE positions (prompt, then response).
RopeIndex = Callable[[Sample], torch.Tensor]
# get_rope_index's inputs besides the tokens, as the processor names them (Qwen2.5-VL
# also takes the videos' second_per_grid_ts).
_GRID_KEYS = ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")


def rope_index_of(model: nn.Module) -> RopeIndex | None:
    """``model``'s M-RoPE positions of one unpacked sample, from its own
    ``get_rope_index`` (on the inner ``Qwen*VLModel`` in transformers 5), cached on the
    sample for the update's other passes; None for a model with 1-D positions."""
    inner = getattr(model, "model", model)
    get_rope_index: Any = getattr(inner, "get_rope_index", None)
    if get_rope_index is None:
        return None

    def positions(s: Sample) -> torch.Tensor:
        if s.rope_positions is None:
            p = s.prompt.input_ids.numel()
            ids = torch.cat([s.prompt.input_ids, s.response_ids])[None]
            # The response is text (type 0), as collate_train pads the prompt's types.
            types = torch.zeros_like(ids)
            if "mm_token_type_ids" in s.prompt.token_extras:
                types[0, :p] = s.prompt.token_extras["mm_token_type_ids"]
            grids = {k: v for k, v in s.prompt.mm_inputs.items() if k in _GRID_KEYS}
            pos, _ = get_rope_index(ids, mm_token_type_ids=types, **grids)
            s.rope_positions = pos[:, 0]
        return s.rope_positions

    return positions


def can_pack(samples: list[Sample], rope: RopeIndex | None) -> bool:
    """Text-only batches always pack; those with images or M-RoPE token types only with
    the model's rope index (their positions are not a plain count)."""
    if rope is not None:
        return True
    return all(not s.prompt.mm_inputs and not s.prompt.token_extras for s in samples)


def runs(samples: list[Sample]) -> list[list[Sample]]:
    """Consecutive samples that share their prompt (one group, or the part of one that a
    micro-batch holds): one row each."""
    out: list[list[Sample]] = []
    for s in samples:
        if out and out[-1][0].prompt is s.prompt:
            out[-1].append(s)
        else:
            out.append([s])
    return out


def row_tokens(run: list[Sample]) -> int:
    """A row's tokens: the prompt once, then every response."""
    return run[0].prompt.input_ids.numel() + sum(s.response_ids.numel() for s in run)


def packed_mask(
    segments: torch.Tensor, mask_dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """The ``[B, 1, L, L]`` attention mask of ``segments`` ([B, L]: 0 prompt, k response
    k, -1 pad), made on ``device`` from the segment ids alone: a token sees the earlier
    tokens of its own segment and of the prompt. Pad queries see the prompt and earlier
    pads (never an empty row: no NaNs); no real token sees a pad. Boolean (True = may
    attend), or additive (0 / the dtype's minimum) in ``mask_dtype``: sdpa would convert
    a boolean mask per layer. Built in place, so the device holds the bool mask and the
    result at most (and a [L, L] causal one): the host makes none of it."""
    seg = segments.to(device)
    width = seg.shape[1]
    idx = torch.arange(width, device=seg.device)
    allowed = seg[:, :, None] == seg[:, None, :]  # [B, query, key]: the same segment
    allowed |= (seg == 0)[:, None, :]  # or the prompt
    allowed &= (idx[None, :] <= idx[:, None])[None]  # causal
    if mask_dtype is None:
        return allowed[:, None]
    floor = torch.finfo(mask_dtype).min
    additive = torch.zeros(allowed.shape, dtype=mask_dtype, device=seg.device)
    return additive.masked_fill_(allowed.logical_not_(), floor)[:, None]


def collate_packed(
    samples: list[Sample], pad_id: int, mask_dtype: torch.dtype | None = None,
    rope: RopeIndex | None = None, device: torch.device | str | None = None,
    segments: bool = False,
) -> TrainBatch:
    """One row per run of samples that share a prompt (``runs``): the prompt once, then
    each response. Positions are the ones generation used: a count for text, ``rope``'s
    for an M-RoPE model, where the prompt's are its first sample's (every sample of a
    run has the same) and each response's its own. The first response token of every
    sample in a row is predicted by the prompt's last position. Rows are padded to
    ``packed_width`` (a multiple of 8 tokens: an aligned mask, see grpo_api.contract);
    the pad columns are attended by no real token. The mask (``packed_mask``) is made
    on ``device`` (the rank's; the host when None) from the segment ids; the other
    tensors stay on the host. With ``segments`` (a model whose attention runs by segment,
    model/segment_attention.py) and where that layout's mask is the smaller, the batch
    carries a ``segment_layout`` and the segment ids as its [B, 1, 1, L] mask instead.
    Each run's multimodal inputs (pixels, image grids) appear once, in row order, as its
    image tokens do."""
    rows = runs(samples)
    width = packed_width(max(row_tokens(r) for r in rows))
    b = len(rows)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    pos = torch.zeros((3 if rope else 1, b, width), dtype=torch.long)
    seg = torch.full((b, width), -1, dtype=torch.int32)  # 0 prompt, k response k, -1 pad
    logit_cols: list[int] = []
    labels: list[torch.Tensor] = []
    positions: list[tuple[int, int, int]] = []
    prompts: list[int] = []
    responses: list[tuple[int, int, int]] = []  # (row, first column, length), non-empty
    for row, run in enumerate(rows):
        p = run[0].prompt.input_ids.numel()
        prompts.append(p)
        ids[row, :p] = run[0].prompt.input_ids
        pos[:, row, :p] = rope(run[0])[:, :p] if rope else torch.arange(p)
        seg[row, :p] = 0
        col = p
        for k, s in enumerate(run, start=1):
            r = s.response_ids.numel()
            ids[row, col : col + r] = s.response_ids
            pos[:, row, col : col + r] = rope(s)[:, p:] if rope else torch.arange(p, p + r)
            seg[row, col : col + r] = k
            if r:
                responses.append((row, col, r))
            positions.append((0, len(logit_cols), r))
            # Token 0 is predicted at the prompt's last position, token j at col + j - 1.
            cols = [p - 1, *range(col, col + r - 1)] if r else []
            logit_cols.extend(row * width + c for c in cols)
            labels.append(s.response_ids)
            col += r
    flat_labels = torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long)
    layout_dtype = mask_dtype or torch.float32
    attention: dict[str, Any]
    if segments and segments_pay(width, prompts, [r for _, _, r in responses],
                                 layout_dtype):
        attention = {
            "attention_mask": seg[:, None, None, :].to(device),
            "segment_layout": segment_layout(prompts, responses, width,
                                             layout_dtype, device),
        }
    else:  # the dense mask only where it is used: it is the larger
        attention = {"attention_mask": packed_mask(seg, mask_dtype, device)}
    inputs = {
        "input_ids": ids,
        **attention,
        # [3, B, L] for M-RoPE (the layout the model's own rope index makes), else [B, L].
        "position_ids": pos if rope else pos[0],
        **concat_mm([run[0].prompt for run in rows]),
    }
    return TrainBatch(
        inputs,
        flat_labels[None],
        torch.ones((1, flat_labels.numel()), dtype=torch.float32),
        positions,
        torch.tensor(logit_cols, dtype=torch.long),
    )
