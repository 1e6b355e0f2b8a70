"""The planner counts videos (issue 50, item 3): spec.data.maxVideosPerPrompt videos of
maxFrames frames at videoMaxPixels per prompt, within the prompt's length, in the vision
tower's activations, as it counts images."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from grpo_api.catalog import GPU_CATALOG as CATALOG
from grpo_api.model.shape import known_family
from grpo_operator.planner.layout import (
    image_tokens,
    images_per_prompt,
    micro_batch,
    prompt_tokens,
    video_tokens,
)
from grpo_operator.planner.stage_terms import compute_budget
from grpo_operator.planner.types import Geometry, Settings

pytestmark = pytest.mark.unit

SETTINGS = Settings(rank0_init=False, offload_params=False, offload_optimizer=False,
                    gradient_checkpointing=False, micro_batch_size=4,
                    rollout_gpu_memory_utilization=0.5, rollout_n=5, ray_object_store_gib=2)


def _geometry(videos: int, prompt: int = 32768, **data: Any) -> Geometry:
    from grpo_api.job import parse_spec
    from grpo_operator.planner.core import geometry
    from grpo_testbed.examples import example_job

    spec = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]
    spec["data"] = {**spec["data"], "maxPromptLength": prompt, "maxResponseLength": 1024,
                    "maxPixels": 1003520, "maxImagesPerPrompt": 1,
                    "maxVideosPerPrompt": videos, **data}
    _, shape = known_family("Qwen/Qwen2.5-VL-7B-Instruct") or ("", None)
    assert shape is not None
    return replace(geometry(parse_spec(spec), CATALOG, shape, "known", 1),
                   global_batch_size=320)


def test_a_job_with_a_video_plans_more_vision_memory_than_one_without() -> None:
    none, one = _geometry(0), _geometry(1)
    assert (none.max_videos_per_prompt, one.max_videos_per_prompt) == (0, 1)
    # The spec's defaults: 32 frames of 100,352 pixels (128 tokens a frame), in pairs.
    assert (one.max_frames, one.video_max_pixels) == (32, 128 * 28 * 28)
    assert video_tokens(one) == 16 * 128
    assert images_per_prompt(none) == 1
    assert images_per_prompt(one) == pytest.approx(1 + 16 * 128 / image_tokens(one))
    for st in (SETTINGS, replace(SETTINGS, micro_batch_tokens=8 * 32768)):
        assert micro_batch(one, st).images > micro_batch(none, st).images
        act = [compute_budget(g, st).gpu_stages["training"]["activations"] for g in (none, one)]
        assert act[1] > act[0], act


def test_video_tokens_stay_within_the_prompt_and_follow_the_settings() -> None:
    # A 2048-token prompt holds one image (1280 tokens) and 768 tokens of video at most.
    short = _geometry(2, prompt=2048)
    assert prompt_tokens(short) == 2048
    assert images_per_prompt(short) == pytest.approx(2048 / 1280)
    # Frames and pixels: 8 frames (4 pairs) of 4 x 28 x 28 pixels (4 tokens each).
    small = _geometry(1, maxFrames=8, videoMaxPixels=4 * 28 * 28)
    assert video_tokens(small) == 4 * 4
    assert images_per_prompt(small) == pytest.approx(1 + 16 / 1280)
    # The most videos a prompt may have count each.
    four = _geometry(4)
    assert images_per_prompt(four) == pytest.approx(1 + 4 * 16 * 128 / 1280)


def test_the_object_store_counts_every_image_and_videos_frames() -> None:
    """What samples from engines apart carry through Ray: each prompt's decoded media."""
    from grpo_operator.planner.resources import step_data_gib

    none, one = _geometry(0), _geometry(1)
    frames = 32 * 128 * 28 * 28 * 3 * none.rollout_batch_size / 2**30
    assert step_data_gib(one, 8) - step_data_gib(none, 8) == pytest.approx(frames)
    four_images = replace(none, max_images_per_prompt=4)
    image = none.max_pixels * 3 * none.rollout_batch_size / 2**30
    assert step_data_gib(four_images, 8) - step_data_gib(none, 8) == pytest.approx(3 * image)
