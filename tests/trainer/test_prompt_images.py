"""One image for rollout and update, with the real tiny Qwen2.5-VL processor: each image
is resized once to the pixel bounds, the processor encodes exactly those pixels, the
rollout engine gets the same image, and the driver's token count (which drops or refuses
overlong prompts at load) is the encoded length."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_trainer.config import build_config
from grpo_trainer.data import Record
from grpo_trainer.images import processor_bounds
from grpo_trainer.samples import load_rollout_tokens, prompt_token_counter
from grpo_trainer.testing.datasets import png

pytestmark = pytest.mark.trainer

# Below the tiny processor's own limit (56 x 56 = 3136 pixels, 4 tokens), as maxPixels is
# below a real checkpoint's (12,845,056): an image the trainer caps at 2 tokens would get
# 4 from the processor's (and vLLM's) own bounds.
MIN_PIXELS, MAX_PIXELS = 28 * 28, 2 * 28 * 28


def test_each_image_is_resized_once_and_both_sides_get_those_pixels(tiny_vlm: Path) -> None:
    from transformers import AutoConfig

    cfg = build_config({
        "model": {"path": str(tiny_vlm)},
        "data": {"train_files": ["unused"], "image_min_pixels": MIN_PIXELS,
                 "image_max_pixels": MAX_PIXELS},
    }, environ={})
    encoder = load_rollout_tokens(cfg, AutoConfig.from_pretrained(tiny_vlm)).encoder
    count = prompt_token_counter(cfg)
    sizes = [(40, 36), (100, 100), (150, 60), (10, 200), (30, 30)]
    records = [Record(i, "<image>How many?", "1", [png((20 * i, 90, 40), size)])
               for i, size in enumerate(sizes)]
    records.append(Record(9, "<image> and <image>: which?", "2",
                          [png((1, 2, 3), (100, 100)), png((3, 2, 1), (44, 36))]))
    for r in records:
        enc = encoder.encode(r)
        grid = enc.mm_inputs["image_grid_thw"]
        for image, (t, h, w) in zip(enc.images, grid.tolist(), strict=True):
            # The processor did not resize what it was given: 14-pixel patches of it.
            assert (t, h * 14, w * 14) == (1, image.size[1], image.size[0])
            assert MIN_PIXELS <= image.size[0] * image.size[1] <= MAX_PIXELS
        assert count(r) == enc.input_ids.numel(), r.index
    # The 100 x 100 image would be 4 tokens at the processor's own bounds, is 1 here.
    assert processor_bounds(encoder.processor.image_processor).tokens(100, 100) == 4
    big = encoder.encode(records[1])
    assert big.images[0].size == (28, 28)
    assert int(big.mm_inputs["image_grid_thw"].prod()) // 4 == 1
