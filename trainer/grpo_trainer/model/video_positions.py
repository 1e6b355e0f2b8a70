"""Qwen2-VL and Qwen2.5-VL positions after a video, as vLLM and the original Qwen compute them.

A video's tokens take M-RoPE positions ``(t * interval, h, w)`` from the position where it
starts (``interval``: Qwen2.5-VL's ``tokens_per_second * second_per_grid_ts``, 1 for
Qwen2-VL). The text after it starts one past the largest of them: Qwen's own code
(transformers 4.x) and vLLM 0.32 (``Qwen2_5_VLForConditionalGeneration.
get_mrope_input_positions``: ``llm_pos_ids_list[-1].max() + 1``). transformers 5.19's
``get_rope_index`` starts it at ``max(h, w) / merge`` past the video's start instead, which
is the same for an image (one temporal patch) but not for a video whose temporal positions
run further (``(T - 1) * interval``: a 4-frame clip at 2 fps has 2 temporal patches 4
positions apart on Qwen2.5-VL's 4 tokens a second). The rollout would then sample the
response at other positions than the update trains it at (a gap of ~1e-3 nats a token on
the tiny test models, against ~1e-5 with these positions: tests/trainer/test_videos.py).
So a prompt with videos gets vLLM's positions: ``match_vllm_video_positions`` replaces the
model's ``get_rope_index`` with ``rope_index``, which leaves prompts without videos to
transformers' own. Qwen3-VL needs none of this: it puts each frame pair apart, between
``<t seconds>`` texts, as one temporal patch (an image's layout).
"""

from __future__ import annotations

import itertools
import types
from typing import Any

import numpy as np
import torch
from torch import nn

# The families whose whole videos are one grid of temporal patches (the rest: Qwen3-VL
# splits them per frame pair).
FAMILIES = ("qwen2_vl", "qwen2_5_vl")
_TEXT, _VIDEO = 0, 2  # mm_token_type_ids: text 0, image 1, video 2


def _grid_positions(start: int, grid: list[int], merge: int, interval: float) -> np.ndarray:
    """[3, t * h * w] positions of one image or video of ``grid`` (t, h, w patches),
    ``start`` the first; temporal ones ``interval`` apart, truncated (vLLM's
    ``(grid_indices[0] * t_factor).astype(np.int64)``, in float64 as there)."""
    t, h, w = grid[0], grid[1] // merge, grid[2] // merge
    pos = np.indices((t, h, w)).reshape(3, -1).astype(np.int64)
    if interval != 1.0:
        pos[0] = (pos[0] * interval).astype(np.int64)
    return pos + start


def _positions(types_: list[int], images: Any, videos: Any, seconds: Any, merge: int,
               per_second: float | None) -> np.ndarray:
    """[3, L] positions of one unpadded sequence of token types."""
    parts: list[np.ndarray] = []
    nxt = 0
    for kind, run in itertools.groupby(types_):
        n = len(list(run))
        if kind == _TEXT:
            parts.append(np.broadcast_to(np.arange(n) + nxt, (3, n)))
            nxt += n
            continue
        grid = [int(x) for x in next(videos if kind == _VIDEO else images)]
        interval = 1.0
        if kind == _VIDEO and per_second is not None:  # Qwen2.5-VL: seconds between patches
            interval = float(next(seconds, 1.0)) * per_second
        part = _grid_positions(nxt, grid, merge, interval)
        if part.shape[1] != n:
            raise ValueError(f"{n} vision tokens for a grid of {part.shape[1]} ({grid})")
        parts.append(part)
        nxt = int(part.max()) + 1
    return np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), dtype=np.int64)


def rope_index(
    inner: nn.Module,
    original: Any,
    input_ids: torch.Tensor,
    mm_token_type_ids: torch.Tensor,
    image_grid_thw: torch.Tensor | None = None,
    video_grid_thw: torch.Tensor | None = None,
    second_per_grid_ts: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``get_rope_index`` (same arguments and results: ``[3, B, L]`` positions and
    ``[B, 1]`` deltas) with vLLM's positions where the batch has videos; else
    transformers' own (``original``)."""
    if video_grid_thw is None or len(video_grid_thw) == 0:
        extra = {} if second_per_grid_ts is None else {"second_per_grid_ts": second_per_grid_ts}
        return original(input_ids, mm_token_type_ids=mm_token_type_ids,
                        image_grid_thw=image_grid_thw, video_grid_thw=video_grid_thw,
                        attention_mask=attention_mask, **extra, **kwargs)
    config: Any = inner.config
    vision = config.vision_config
    merge = int(vision.spatial_merge_size)
    per_second = getattr(vision, "tokens_per_second", None)
    images = iter(image_grid_thw.tolist() if image_grid_thw is not None else [])
    videos = iter(video_grid_thw.tolist())
    seconds = iter(second_per_grid_ts.tolist() if second_per_grid_ts is not None else [])
    out = torch.zeros((3, *input_ids.shape), dtype=input_ids.dtype, device=input_ids.device)
    deltas: list[int] = []
    for b in range(input_ids.shape[0]):
        keep = (attention_mask[b].bool() if attention_mask is not None
                else torch.ones(input_ids.shape[1], dtype=torch.bool, device=input_ids.device))
        kinds = mm_token_type_ids[b][keep].tolist()
        pos = _positions(kinds, images, videos, seconds, merge,
                         None if per_second is None else float(per_second))
        out[:, b, keep] = torch.from_numpy(pos).to(out.device, out.dtype)
        deltas.append((int(pos.max()) + 1 if pos.size else 0) - len(kinds))
    return out, torch.tensor(deltas, device=input_ids.device).unsqueeze(1)


def match_vllm_video_positions(model: nn.Module) -> bool:
    """Give a Qwen2-VL or Qwen2.5-VL ``model`` (or its inner ``Qwen*VLModel``) vLLM's
    positions for prompts with videos (module docstring): its ``get_rope_index``, which
    its forward, its generation and the update's packing (``packing.rope_index_of``) all
    call, is replaced on the instance. Returns whether it was (other models: False)."""
    inner = getattr(model, "model", model)
    config = getattr(inner, "config", None)
    original = getattr(inner, "get_rope_index", None)
    if getattr(config, "model_type", None) not in FAMILIES or original is None:
        return False
    if getattr(original, "__func__", None) is not None and getattr(
            original.__func__, "_vllm_video_positions", False):
        return True  # already installed

    def get_rope_index(self: nn.Module, *args: Any, **kwargs: Any
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_index(self, original, *args, **kwargs)

    get_rope_index._vllm_video_positions = True  # type: ignore[attr-defined]
    inner.get_rope_index = types.MethodType(get_rope_index, inner)
    return True
