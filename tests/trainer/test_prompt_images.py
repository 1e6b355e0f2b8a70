"""One image for rollout and update, with the real tiny Qwen2.5-VL processor: each image
is resized once to the pixel bounds, the processor encodes exactly those pixels, the
rollout engine gets the same image, and the driver's token count (which drops or refuses
overlong prompts at load) is the encoded length."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_testkit.datasets import png
from grpo_trainer.algorithm.samples import load_rollout_tokens, prompt_token_counter
from grpo_trainer.config import build_config
from grpo_trainer.data import Record
from grpo_trainer.media.images import processor_bounds

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


def test_the_driver_drops_or_refuses_overlong_prompts_as_the_ranks_count_them(
    tiny_vlm: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The driver's own check, before Ray starts: the real tokenizer and processor count
    each row (the 100 x 100 image at its resized size); with a limit between the rows'
    lengths the long one is dropped, or refused with data.overlong_prompts: fail."""
    import re

    import pyarrow as pa
    import pyarrow.parquet as pq

    from grpo_trainer.config_error import ConfigError
    from grpo_trainer.driver.driver import GRPOTrainer

    rows = [("<image>How many?", png((9, 9, 9), (100, 100))),
            ("<image>" + " and then some more words" * 6, png((9, 9, 9), (40, 36))),
            ("<image>Which?", png((1, 1, 1), (44, 36)))] * 2
    data = tmp_path / "train.parquet"
    pq.write_table(pa.table({"problem": [p for p, _ in rows], "answer": ["1"] * len(rows),
                             "images": [[{"bytes": b, "path": None}] for _, b in rows]}), data)
    cfg = build_config({
        "model": {"path": str(tiny_vlm)},
        "data": {"train_files": [str(data)], "image_min_pixels": MIN_PIXELS,
                 "image_max_pixels": MAX_PIXELS, "max_prompt_length": 60},
        "trainer": {"rollout_batch_size": 2, "total_steps": 1},
        "resources": {"num_workers": 1},
        "metrics": {"progress_bar": "off"},
    }, environ={})
    count = prompt_token_counter(cfg)
    lengths = [count(Record(i, p, "1", [b])) for i, (p, b) in enumerate(rows)]
    assert lengths[0] <= 60 < lengths[1], lengths
    trainer = GRPOTrainer(cfg)
    trainer.close()
    assert [r.row for r in trainer.loader.dataset.records] == [0, 2, 3, 5]
    dropped = [r.getMessage() for r in caplog.records if r.getMessage().startswith("dropped")]
    assert dropped and f"{data} row 1: the prompt has {lengths[1]} tokens" in dropped[0]
    cfg.data.overlong_prompts = "fail"
    with pytest.raises(ConfigError, match=re.escape(f"{data} row 1: the prompt has")):
        GRPOTrainer(cfg)
