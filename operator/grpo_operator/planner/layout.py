"""The update's micro-batch at its largest, in the trainer's shared-prefix layout
(grpo_trainer.algorithm.packing: one row per group in the micro-batch, its prompt once and then its
responses, rows padded to the widest, rounded up to a multiple of 8 tokens,
``grpo_api.contract.packed_width``): the bounds the activation, logits and mask terms are
computed from (docs/memory-model.md, "Micro-batches by tokens"). The rounding keeps the
4-D mask aligned for SDPA's memory-efficient kernel, which would otherwise keep a padded
copy of it per layer for backward.

By tokens (``Settings.micro_batch_tokens``), the budget bounds the layout itself, padding
included, so the terms follow from it; by samples (a spec that pins ``microBatchSize``),
the layout of ``b`` samples is at most that of ``r`` groups with one holding the rest of
the samples, worst over ``r``: ``max_r r w(P + min(b - r + 1, n) R)`` (``w`` the
rounding), which exceeds the padded layout's ``b s`` when responses are long next to the
prompt (the rows pad to the widest). Pure: geometry and settings in, counts out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from grpo_api.contract import packed_width, segment_layout_bytes

from .types import Geometry, Settings

# Patches of 2 x 2 merge into one language-model token in every supported family (the
# merger's width, 4 hv, is counted in grpo_api.model.shape the same way).
PATCHES_PER_TOKEN = 4
# Video frames per patch in time (Qwen2/2.5/3-VL's temporal_patch_size): an image is one
# such patch of two copies of itself, a video one per pair of frames.
TEMPORAL_PATCH = 2


@dataclass(frozen=True)
class MicroBatch:
    """The largest micro-batch the trainer can form under a plan: counts, not bytes."""

    tokens: int  # rows x the widest row, padding included: what the decoder processes
    images: float  # rows x images_per_prompt: each row's prompt's images, at maxPixels
    response_tokens: int  # what the chunked log-prob head sees
    # rows x width^2, the width rounded up to a multiple of 8 (packed_width): the dense
    # 4-D attention mask, in the compute dtype
    mask_elements: int
    responses: int  # the most responses it holds (the segment layout's slots)


def prompt_tokens(geo: Geometry) -> int:
    return geo.sequence_length - geo.response_length


def per_rank_samples(geo: Geometry) -> int:
    """Samples of one rank's mini-batch (the update's micro-batches are cut from it)."""
    return max(1, geo.global_batch_size // geo.world_size)


def _groups_spanned(samples: int, n: int, mini: int) -> int:
    """Groups of ``n`` that a slice of ``samples`` consecutive samples touches at most,
    cut as the trainer cuts them: a rank's samples are whole groups, its mini-batches
    ``mini`` samples from their start, its micro-batches by samples ``samples`` from a
    mini-batch's start. Such a slice starts a multiple of g = gcd(mini, samples, n) into
    a group, at worst n - g: it touches ceil((n - g + samples) / n) groups."""
    g = math.gcd(mini, samples, n)
    return min(samples, math.ceil((n - g + samples) / n))


def _by_samples(geo: Geometry, samples: int, n: int) -> MicroBatch:
    p, r = prompt_tokens(geo), geo.response_length
    tokens = mask = 0
    rows = _groups_spanned(samples, n, per_rank_samples(geo))
    for k in range(1, rows + 1):
        width = packed_width(p + min(samples - k + 1, n) * r)
        tokens, mask = max(tokens, k * width), max(mask, k * width * width)
    return MicroBatch(tokens, rows * images_per_prompt(geo), samples * r, mask, samples)


def image_tokens(geo: Geometry) -> int:
    """One image at maxPixels, in language-model tokens (within the prompt's length)."""
    patches = geo.max_pixels // geo.shape.patch_size**2
    return max(1, min(prompt_tokens(geo), patches // PATCHES_PER_TOKEN))


def video_tokens(geo: Geometry) -> int:
    """One video of maxFrames frames at videoMaxPixels, in language-model tokens (within
    the prompt's length): each pair of frames (Qwen's temporal patch) is as many patches
    as one image of that size, so a video is maxFrames / 2 such images."""
    pairs = max(1, geo.max_frames // TEMPORAL_PATCH)
    patches = pairs * (geo.video_max_pixels // geo.shape.patch_size**2)
    return max(1, min(prompt_tokens(geo), patches // PATCHES_PER_TOKEN))


def images_per_prompt(geo: Geometry) -> float:
    """A prompt's vision input at most, counted in images at maxPixels: spec.data.
    maxImagesPerPrompt images and maxVideosPerPrompt videos (``video_tokens``; the trainer
    leaves out or refuses rows with more, and its vLLM limits never exceed them), and no
    more vision tokens than the prompt holds (they count in its length). The vision
    tower's activations are per patch, and a patch is one token's quarter for images and
    video frames alike, so tokens convert to images at maxPixels. The planner never sees
    the data: the spec says what it holds."""
    its = image_tokens(geo)
    vision = geo.max_images_per_prompt * its + geo.max_videos_per_prompt * video_tokens(geo)
    return min(vision, prompt_tokens(geo)) / its


def micro_batch(geo: Geometry, st: Settings) -> MicroBatch:
    """The largest micro-batch under ``st``: by its token budget, or by samples."""
    n = max(1, st.rollout_n)
    whole = _by_samples(geo, per_rank_samples(geo), n)  # the rank's mini-batch at once
    if not st.micro_batch_tokens:
        mb = max(1, min(st.micro_batch_size, per_rank_samples(geo)))
        return _by_samples(geo, mb, n)
    # The budget bounds every micro-batch but one sample alone, one row of its rounded
    # width (the trainer's micro_batches._greedy): the least budget.
    budget = max(min(st.micro_batch_tokens, whole.tokens), least_budget(geo))
    widest = packed_width(prompt_tokens(geo) + n * geo.response_length)
    # Each row holds a prompt, its images' tokens among them, and a response token.
    per_prompt = images_per_prompt(geo)
    rows = min(whole.images / per_prompt,
               max(1, budget // (per_prompt * image_tokens(geo) + 1)))
    return MicroBatch(
        tokens=budget,
        images=rows * per_prompt if geo.shape.vision_parameters else 0,
        response_tokens=min(budget, whole.response_tokens),
        mask_elements=min(budget * min(budget, widest), whole.mask_elements),
        # Each response holds a token of the budget's.
        responses=min(whole.responses, budget),
    )


def attention_layout_bytes(geo: Geometry, mb: MicroBatch, dtype_bytes: int) -> int:
    """The packed micro-batch's attention layout at most: the trainer takes the segment
    layout where it is smaller than the dense mask (grpo_trainer.model.segment_attention),
    so the lesser of the two worst cases bounds every micro-batch's."""
    dense = mb.mask_elements * dtype_bytes
    by_segment = segment_layout_bytes(mb.tokens, [(mb.responses, geo.response_length)],
                                      mb.response_tokens, prompt_tokens(geo), dtype_bytes)
    return min(dense, by_segment)


def least_budget(geo: Geometry) -> int:
    """The least micro-batch the trainer makes: one whole sample (prompt + response),
    one row of its rounded width."""
    return packed_width(geo.sequence_length)


def token_budgets(geo: Geometry, n: int) -> list[int]:
    """The budgets the planner tries, largest first: the rank's whole mini-batch at once,
    halved down to one whole sample (``least_budget``), which is the least."""
    least = least_budget(geo)
    budget = _by_samples(geo, per_rank_samples(geo), max(1, n)).tokens
    out = []
    while budget > least:
        out.append(budget)
        budget //= 2
    return [*out, least]
