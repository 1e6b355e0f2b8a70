"""Video frames (grpo_trainer.media.videos): sampled at data.video_fps from a real mp4 written here
with OpenCV, at most data.max_frames, an even count, each frame resized within the video
pixel bounds; a frame list taken as it is; what the headers say equals what decoding
gives; a corrupt video's error names it. And what vLLM is told about them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from grpo_testkit.video_files import frame_color, frame_list, write_mp4
from grpo_trainer.media.images import PixelBounds
from grpo_trainer.media.videos import (
    VideoError,
    VideoSpec,
    load,
    metadata_object,
    probe,
    timestamps_of,
)

pytestmark = pytest.mark.unit

# 28-pixel tokens (Qwen2/2.5-VL's 14-pixel patches, 2 x 2 merged), 1 to 4 tokens a frame.
SPEC = VideoSpec(fps=2.0, max_frames=8, bounds=PixelBounds(28 * 28, 56 * 56, 28, "video"))


def _colors(frames: np.ndarray) -> list[tuple[int, int, int]]:
    """Each frame's mean colour, rounded (mp4v keeps a flat frame within a few levels)."""
    return [tuple(int(c) for c in f.reshape(-1, 3).mean(0).round()) for f in frames]


def _near(got: tuple[int, int, int], want: tuple[int, int, int]) -> bool:
    return max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 6


def test_frames_are_sampled_at_the_fps_over_the_whole_video(tmp_path: Path) -> None:
    """8 frames at 4 fps (2 s) sampled at 2 fps: 4 frames, first and last included."""
    mp4 = write_mp4(tmp_path / "a.mp4", 8, 4.0, (56, 56))
    video = load(str(mp4), SPEC)
    assert video.frames.shape == (4, 56, 56, 3) and video.frames.dtype == np.uint8
    assert video.indices == [0, 2, 5, 7]
    assert all(_near(c, frame_color(i)) for c, i in zip(_colors(video.frames), video.indices,
                                                         strict=True))
    meta = video.metadata()
    assert meta["fps"] == 4.0 and meta["total_num_frames"] == 8 and meta["duration"] == 2.0
    assert meta["frames_indices"] == [0, 2, 5, 7] and (meta["width"], meta["height"]) == (56, 56)
    # Qwen2.5-VL's temporal positions follow from this: 2 frames a second were sampled.
    assert metadata_object(video).sampled_fps == pytest.approx(2.0)


def test_at_most_max_frames_an_even_count_padded_with_the_last(tmp_path: Path) -> None:
    mp4 = write_mp4(tmp_path / "long.mp4", 20, 10.0, (56, 56))
    dense = replace(SPEC, fps=8.0)  # 16 frames wanted, 8 allowed, spread over the video
    assert load(str(mp4), dense).indices == [0, 3, 5, 8, 11, 14, 16, 19]
    # An odd number sampled (3 frames of a 1.5 s clip at 2 fps): the last one repeated.
    short = write_mp4(tmp_path / "short.mp4", 3, 2.0, (56, 56))
    video = load(str(short), SPEC)
    assert video.frames.shape[0] == 4 and video.indices == [0, 1, 2]
    assert np.array_equal(video.frames[3], video.frames[2])
    # The pad is no sample: the frame rate the metadata implies is still the video's.
    assert metadata_object(video).sampled_fps == pytest.approx(2.0)
    # A one-frame video is a whole temporal patch too.
    one = write_mp4(tmp_path / "one.mp4", 1, 2.0, (56, 56))
    assert load(str(one), SPEC).frames.shape[0] == 2
    # A source slower than the fps: every frame, none invented.
    slow = write_mp4(tmp_path / "slow.mp4", 4, 1.0, (56, 56))
    assert load(str(slow), SPEC).indices == [0, 1, 2, 3]


def test_each_frame_is_resized_within_the_bounds_and_probe_says_so_without_decoding(
    tmp_path: Path,
) -> None:
    for size in ((100, 60), (30, 30), (200, 50)):
        mp4 = write_mp4(tmp_path / f"{size[0]}x{size[1]}.mp4", 6, 4.0, size)
        video, shape = load(str(mp4), SPEC), probe(str(mp4), SPEC)
        t, h, w, _ = video.frames.shape
        assert (w, h) == SPEC.bounds.size(*size)
        assert w % 28 == 0 and h % 28 == 0 and 28 * 28 <= w * h <= 56 * 56
        assert (shape.width, shape.height) == size and SPEC.padded(shape.frames) == t
        assert list(shape.indices) == video.indices
        assert shape.tokens(SPEC) == t // 2 * (w // 28) * (h // 28)


def test_a_frame_list_is_taken_as_it_is(tmp_path: Path) -> None:
    frames = frame_list(5, (60, 40))
    video = load(frames, SPEC)
    # As frames sampled at data.video_fps: all 5 (not 2 fps of a 5-fps video), padded.
    assert video.frames.shape == (6, 28, 56, 3)  # 60 x 40 resized to 56 x 28
    assert video.indices == [0, 1, 2, 3, 4] and video.fps == SPEC.fps
    assert all(_near(c, frame_color(i)) for c, i in zip(_colors(video.frames[:5]), range(5),
                                                         strict=True))
    # More than max_frames: thinned evenly, first and last kept.
    many = load(frame_list(12, (28, 28)), SPEC)
    assert many.indices == [0, 2, 3, 5, 6, 8, 9, 11] and many.frames.shape[0] == 8
    assert probe(frame_list(12, (28, 28)), SPEC).indices == tuple(many.indices)


def test_a_video_that_cannot_be_used_is_named_with_what_is_wrong(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"not a video" * 100)
    for path in (corrupt, tmp_path / "missing.mp4"):
        with pytest.raises(VideoError, match=f"video {path}: cannot be opened"):
            probe(str(path), SPEC)
        with pytest.raises(VideoError, match="cannot be opened"):
            load(str(path), SPEC)
    with pytest.raises(VideoError, match="frame list is empty: it has no frames"):
        load([], SPEC)
    with pytest.raises(VideoError, match="frame 1 of a video's frame list is not an image"):
        load([frame_list(1, (28, 28))[0], b"junk"], SPEC)
    assert issubclass(VideoError, ValueError)  # what the prompt-length check catches


def test_qwen3_frame_times_are_the_processors() -> None:
    """``timestamps_of`` is Qwen3VLProcessor's ``_calculate_timestamps`` (count_tokens writes
    the same ``<t seconds>`` texts the processor and vLLM write)."""
    from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

    for idx, fps in (([0, 2, 5, 7], 4.0), ([0, 1, 2], 2.0), ([3], 30.0)):
        theirs = Qwen3VLProcessor._calculate_timestamps(None, list(idx), fps, 2)  # type: ignore[arg-type]
        assert timestamps_of(idx, fps, 2) == theirs


def test_vllm_is_given_the_frames_and_told_to_leave_them_alone(tmp_path: Path) -> None:
    """limit_mm_per_prompt's video is the data's (0 stays 0: the trainer's default); with
    videos, vLLM's video kwargs neither resize nor resample and bound the pixels the way
    each family reads them; each video goes as (frames, metadata)."""
    import torch

    from grpo_trainer.algorithm.samples import EncodedPrompt
    from grpo_trainer.data import Record
    from grpo_trainer.rollout.vllm_engine import VLLMEngineConfig, _inputs, engine_kwargs

    bounds = PixelBounds(3136, 1003520, 28)
    base = VLLMEngineConfig("m", "bfloat16", 1, 64, 4, 0.5, 0, 0, False, image_bounds=bounds)
    assert base.max_videos_per_prompt == 0
    kw = engine_kwargs(base, on_cpu=True, sleep_mode=False, distributed=False)
    assert kw["limit_mm_per_prompt"]["video"] == 0
    assert kw["mm_processor_kwargs"] == {"min_pixels": 3136, "max_pixels": 1003520}
    for timestamps, most in ((False, 56 * 56), (True, 8 * 56 * 56)):
        spec = replace(SPEC, timestamps=timestamps)
        cfg = replace(base, max_videos_per_prompt=2, video_spec=spec)
        kw = engine_kwargs(cfg, on_cpu=False, sleep_mode=True, distributed=True)
        assert kw["limit_mm_per_prompt"] == {"image": base.max_images_per_prompt, "video": 2}
        assert kw["mm_processor_kwargs"] == {
            "min_pixels": 3136, "max_pixels": 1003520,  # the images'
            "videos_kwargs": {"do_resize": False, "do_sample_frames": False,
                              "cap_pixels_per_frame": False,
                              "min_pixels": 28 * 28, "max_pixels": most}}
        assert "mm_device_do_normalize" not in kw  # vLLM's default: on the device
    # A video processor that normalises otherwise than the image processor: on the host.
    kw = engine_kwargs(replace(base, max_videos_per_prompt=1, video_spec=SPEC,
                               device_normalize=False),
                       on_cpu=True, sleep_mode=False, distributed=False)
    assert kw["mm_device_do_normalize"] is False
    video = load(str(write_mp4(tmp_path / "a.mp4", 8, 4.0, (56, 56))), SPEC)
    prompt = EncodedPrompt(Record(0, "<video>?", "1", videos=["a.mp4"]),
                           torch.zeros(3, dtype=torch.long), raw_prompt_ids=[1, 2, 3],
                           videos=[video])
    (item,) = _inputs([prompt])
    ((frames, meta),) = item["multi_modal_data"]["video"]
    assert frames is video.frames and "image" not in item["multi_modal_data"]
    assert meta == {**video.metadata(), "do_sample_frames": False}
