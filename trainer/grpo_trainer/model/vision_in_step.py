"""Every rank runs the vision tower in every forward, images or not.

Each vision block is an FSDP2 unit of its own (``modeling._blocks``), so running it is a
collective: an all-gather in forward, a reduce-scatter in backward. Transformers skips the
tower when a forward has no ``pixel_values`` (Qwen2-VL, Qwen2.5-VL and Qwen3-VL alike:
``Qwen2_5_VLModel.forward`` in transformers 5.19's ``modeling_qwen2_5_vl.py`` calls
``get_image_features`` only ``if ... pixel_values is not None``). A rank whose micro-batch
is text only would then issue one all-gather per vision block fewer than a rank with
images; NCCL and gloo pair collectives by order, so the ranks hang or trade tensors of
the wrong blocks (gloo aborts: ``op.preamble.length <= op.nbytes``).

The fix, as verl and EasyR1 do it: a forward that ran no image through the tower runs a
zero image of the smallest grid through it just before the language model, at the very
point an image forward runs it, and adds ``0 *`` its outputs to the input embeddings.
Chosen over moving the tower into the root unit, which would still leave the text-only
rank's tower parameters without gradients (FSDP2 reduce-scatters only the parameters
that have one: ``FSDPParamGroup.post_backward`` in torch 2.13's
``_fully_shard/_fsdp_param_group.py``) and would hold the whole tower gathered for the
whole pass. Adding an exact zero changes no log-prob and no gradient: the tower's
parameters get zero gradients on that rank, so every rank reduces the same tensors.

The cost is one tiny tower pass (``spatial_merge_size**2`` patches) per text-only
forward. With videos (``data.max_videos_per_prompt`` > 0) a forward can run the tower twice,
once for its images (``get_image_features``) and once for its videos
(``get_video_features``), so every forward then runs it exactly twice (``tower_passes``):
the zero image fills in for whichever of the two a micro-batch lacks, and a rank with
images and videos issues the collectives of one with neither.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class _TowerState:
    runs: int = 0  # the tower's passes in the current forward


def tower_passes(max_videos_per_prompt: int) -> int:
    """The tower's passes in every forward of a job: one (its images, or the zero image),
    and with videos one more (transformers encodes a forward's videos in a pass of their
    own)."""
    return 2 if max_videos_per_prompt > 0 else 1


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every floating tensor in a model output (ModelOutput, tuples, lists of splits)."""
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield value
    elif isinstance(value, dict):  # ModelOutput is an OrderedDict
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, list | tuple):
        for v in value:
            yield from _tensors(v)


def dummy_image(vision_config: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The smallest image the tower takes: one frame of ``spatial_merge_size`` squared
    patches (the merger needs a whole window), zeros, as the image processor lays out
    ``pixel_values`` (patches x channels * temporal_patch_size * patch_size**2)."""
    merge = int(vision_config.spatial_merge_size)
    width = (int(vision_config.in_channels) * int(vision_config.temporal_patch_size)
             * int(vision_config.patch_size) ** 2)
    pixels = torch.zeros(merge * merge, width, device=device)
    grid = torch.tensor([[1, merge, merge]], dtype=torch.long, device=device)
    return pixels, grid


def _vision_parts(model: nn.Module) -> tuple[nn.Module, nn.Module, nn.Module] | None:
    """(the module holding ``get_image_features``, its tower, its language model), or
    None for a model without a vision tower."""
    for module in model.modules():
        visual = getattr(module, "visual", None)
        language = getattr(module, "language_model", None)
        if (isinstance(visual, nn.Module) and isinstance(language, nn.Module)
                and hasattr(module, "get_image_features") and module is not model):
            return module, visual, language
    return None


def keep_vision_in_step(model: nn.Module, passes: int = 1) -> bool:
    """Make every forward of ``model`` run its vision tower ``passes`` times (module
    docstring; ``tower_passes``). Returns whether the model has one. Install once, on the
    FSDP-sharded modules (actor and reference): an unsharded copy (the transformers
    rollout engine) needs no lockstep."""
    parts = _vision_parts(model)
    if parts is None:
        return False
    owner, visual, language = parts
    vision_config = getattr(getattr(model, "config", None), "vision_config", None)
    if vision_config is None:
        return False
    state = _TowerState()

    def forward_starts(_module: nn.Module, _args: Any) -> None:
        state.runs = 0

    def tower_ran(_module: nn.Module, _args: Any, _out: Any) -> None:
        state.runs += 1

    def before_language_model(
        _module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        embeds = kwargs.get("inputs_embeds")
        missing = passes - state.runs
        if missing <= 0 or not isinstance(embeds, torch.Tensor):
            return None
        pixels, grid = dummy_image(vision_config, embeds.device)
        total = embeds.new_zeros((), dtype=torch.float32)
        for _ in range(missing):
            out = owner.get_image_features(pixels, grid, return_dict=True)  # type: ignore[operator]
            total = sum((t.float().sum() for t in _tensors(out)), total)
        kwargs["inputs_embeds"] = embeds + (total * 0.0).to(embeds.dtype)
        return args, kwargs

    owner.register_forward_pre_hook(forward_starts)
    visual.register_forward_hook(tower_ran)
    language.register_forward_pre_hook(before_language_model, with_kwargs=True)
    return True
