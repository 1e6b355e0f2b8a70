"""Video prompts on every VLM family the trainer trains (Qwen2-VL, Qwen2.5-VL, Qwen3-VL),
with the real tiny models and processors: the prompt length counted from the headers is
the encoded one; the processor gets the frames the trainer sampled and sized, untouched;
the update's packed forward gives the log-probs of the plain padded one; a forward runs
the vision tower as often on every rank. vLLM's side: tests/vllm/test_videos.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_testkit.datasets import png
from grpo_testkit.video_files import frame_list, write_mp4
from grpo_trainer.algorithm.grpo_math import log_probs_from_logits
from grpo_trainer.algorithm.packing import can_pack, collate_packed, rope_index_of
from grpo_trainer.algorithm.samples import PromptEncoder, Sample, TrainBatch, collate_train
from grpo_trainer.config import build_config
from grpo_trainer.data import Record
from grpo_trainer.model.video_positions import match_vllm_video_positions

pytestmark = pytest.mark.trainer

FAMILIES = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
# Frames of up to 84 x 84 pixels: above the tiny processors' own 56 x 56 (64 x 64 for
# Qwen3-VL), so a resize of theirs would show.
VIDEO_MAX_PIXELS = 84 * 84


def _encoder(model: Path) -> PromptEncoder:
    from transformers import AutoConfig

    from grpo_trainer.algorithm.samples import load_rollout_tokens

    cfg = build_config({
        "model": {"path": str(model)},
        "data": {"train_files": ["unused"], "format_prompt": "r1v",
                 "image_min_pixels": 28 * 28, "image_max_pixels": 2 * 28 * 28,
                 "video_min_pixels": 28 * 28, "video_max_pixels": VIDEO_MAX_PIXELS,
                 "max_frames": 4, "max_videos_per_prompt": 2},
    }, environ={})
    return load_rollout_tokens(cfg, AutoConfig.from_pretrained(model)).encoder


def _records(tmp_path: Path) -> list[Record]:
    """A video file alone; an image, a 3-frame list (padded to 4) and a file; a text
    prompt (beside the video ones in a micro-batch)."""
    mp4 = write_mp4(tmp_path / "clip.mp4", 8, 4.0, (100, 70))  # 2 s: 4 frames at 2 fps
    return [
        Record(0, "<video>What happens?", "1", videos=[str(mp4)]),
        Record(1, "<image>Then <video> and <video>: which is longer?", "2",
               images=[png((200, 30, 30), (44, 36))],
               videos=[frame_list(3, (60, 40)), str(mp4)]),
        Record(2, "No video here: say 7", "7"),
    ]


@pytest.mark.parametrize("family", FAMILIES)
def test_the_counted_length_is_the_encoded_one_and_the_frames_reach_the_processor_as_sized(
    tiny_vl_families: dict[str, Path], family: str, tmp_path: Path
) -> None:
    from grpo_trainer.media.videos import same_normalisation

    enc = _encoder(tiny_vl_families[family])
    spec = enc.video_spec
    assert spec is not None and spec.timestamps == (family == "qwen3_vl")
    # The tiny Qwen3-VL's image processor (Qwen2VLImageProcessor) normalises with CLIP's
    # mean, its video processor with 0.5: vLLM then normalises on the host (build.py).
    assert same_normalisation(enc.processor) == (family != "qwen3_vl")
    factor = spec.bounds.factor
    for r in _records(tmp_path):
        p = enc.encode(r)
        assert enc.count_tokens(r) == p.input_ids.numel(), (family, r.index)
        if not r.videos:
            assert not p.videos and "pixel_values_videos" not in p.mm_inputs
            continue
        grids = p.mm_inputs["video_grid_thw"].tolist()
        patch = factor // 2
        for v, (t, h, w) in zip(p.videos, grids, strict=True):
            frames, height, width = v.frames.shape[:3]
            # The processor encoded exactly these frames: no resize, no resampling.
            assert (t * 2, h * patch, w * patch) == (frames, height, width)
            assert frames == 4 and height % factor == 0 and width % factor == 0
            assert height * width <= VIDEO_MAX_PIXELS
        # The 100 x 70 clip keeps more pixels than the processor's own bounds allow.
        assert p.videos[-1].frames.shape[1:3] == tuple(
            reversed(spec.bounds.size(100, 70)))
        assert p.videos[-1].frames.shape[1] * p.videos[-1].frames.shape[2] > 64 * 64
        n_videos = len(r.videos)
        if family == "qwen2_5_vl":  # 2 frames a second sampled: 1 s per temporal patch
            torch.testing.assert_close(p.mm_inputs["second_per_grid_ts"],
                                       torch.ones(n_videos))
        else:
            assert "second_per_grid_ts" not in p.mm_inputs
        video_tokens = int((p.token_extras["mm_token_type_ids"] == 2).sum())
        assert video_tokens == sum(t * h * w // 4 for t, h, w in grids)


def _samples(prompts: list[Any]) -> list[Sample]:
    gen = torch.Generator().manual_seed(0)
    return [Sample(p, torch.randint(10, 300, (n,), generator=gen), torch.zeros(n), True)
            for p, ns in zip(prompts, [[5, 1, 9], [7, 3], [4]], strict=True) for n in ns]


def _log_probs(model: torch.nn.Module, batch: TrainBatch) -> list[torch.Tensor]:
    with torch.no_grad():
        logits = batch.response_logits(model(**batch.model_inputs, use_cache=False).logits)
    return batch.gather(log_probs_from_logits(logits, batch.labels))


@pytest.mark.parametrize("family", FAMILIES)
def test_the_packed_update_gives_the_plain_forwards_log_probs_with_videos(
    tiny_vl_families: dict[str, Path], family: str, tmp_path: Path
) -> None:
    """float32: the update's shared-prefix rows (the model's M-RoPE positions of each
    unpacked sample, the videos' pixels once per prompt) against the padded layout, in
    which the model computes every position itself: within 1e-5 a token."""
    from transformers import AutoModelForImageTextToText

    path = tiny_vl_families[family]
    enc = _encoder(path)
    samples = _samples([enc.encode(r) for r in _records(tmp_path)])
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32,
                                                        attn_implementation="sdpa").eval()
    # As the trainer loads it (modeling.load_full): vLLM's positions after a video.
    assert match_vllm_video_positions(model) == (family != "qwen3_vl")
    rope = rope_index_of(model)
    assert rope is not None and can_pack(samples, rope)
    plain = collate_train(samples, int(enc.tokenizer.pad_token_id))
    packed = collate_packed(samples, int(enc.tokenizer.pad_token_id), torch.float32, rope)
    assert "pixel_values_videos" in packed.model_inputs
    # Each prompt's videos once in the packed rows, once per response in the padded ones.
    per_prompt = [p.mm_inputs["pixel_values_videos"].shape[0]
                  for p in (samples[0].prompt, samples[3].prompt)]
    assert packed.model_inputs["pixel_values_videos"].shape[0] == sum(per_prompt)
    plain_rows = plain.model_inputs["pixel_values_videos"].shape[0]
    assert plain_rows == 3 * per_prompt[0] + 2 * per_prompt[1]
    for a, b, s in zip(_log_probs(model, packed), _log_probs(model, plain), samples,
                       strict=True):
        assert a.shape == s.response_ids.shape
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_text_after_a_video_starts_past_the_videos_last_temporal_position(
    tiny_vl_families: dict[str, Path], tmp_path: Path
) -> None:
    """Qwen2.5-VL, 4 frames at 2 fps: 2 temporal patches, 4 positions apart (4 tokens a
    second). The text after the video starts one past the largest position, as in vLLM
    and Qwen's own code, where transformers 5.19 starts it at the video's start plus its
    height (video_positions.py); prompts without videos keep transformers' positions."""
    from transformers import AutoModelForImageTextToText

    path = tiny_vl_families["qwen2_5_vl"]
    enc = _encoder(path)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32)
    inner: Any = model.model
    original = inner.get_rope_index
    prompt = enc.encode(_records(tmp_path)[0])
    types = prompt.token_extras["mm_token_type_ids"][None]
    grids = {k: v for k, v in prompt.mm_inputs.items() if "grid" in k or "second" in k}
    theirs, _ = original(prompt.input_ids[None], mm_token_type_ids=types, **grids)
    assert match_vllm_video_positions(model) and match_vllm_video_positions(model)
    ours, delta = inner.get_rope_index(prompt.input_ids[None], mm_token_type_ids=types, **grids)
    video = (types[0] == 2).nonzero()[:, 0]
    start, end = int(video[0]), int(video[-1]) + 1
    assert torch.equal(ours[:, 0, :end], theirs[:, 0, :end])  # the video's own agree
    t_max = int(ours[0, 0, start:end].max())
    assert t_max == int(ours[0, 0, start]) + 4  # the second patch, 1 s = 4 positions on
    assert int(ours[:, 0, end].min()) == int(ours[:, 0, :end].max()) + 1
    assert int(theirs[:, 0, end].max()) <= t_max  # transformers: within the video's
    assert int(delta) == int(ours.max()) + 1 - prompt.input_ids.numel()
    # No video: transformers' own.
    image = enc.encode(Record(5, "<image>hi", "1", images=[png((1, 2, 3), (44, 36))]))
    itypes = image.token_extras["mm_token_type_ids"][None]
    a, _ = inner.get_rope_index(image.input_ids[None], mm_token_type_ids=itypes,
                                image_grid_thw=image.mm_inputs["image_grid_thw"])
    b, _ = original(image.input_ids[None], mm_token_type_ids=itypes,
                    image_grid_thw=image.mm_inputs["image_grid_thw"])
    assert torch.equal(a, b)


def test_with_videos_every_forward_runs_the_tower_twice_and_adds_nothing(
    tiny_vl_families: dict[str, Path], tmp_path: Path
) -> None:
    """A micro-batch may hold images and videos (two tower passes), images or videos only
    (one), or text only (none): with videos allowed every forward runs it twice, the zero
    image filling in, so FSDP ranks issue the same collectives (vision_in_step.py)."""
    from transformers import AutoModelForImageTextToText

    from grpo_trainer.model.vision_in_step import keep_vision_in_step, tower_passes

    assert (tower_passes(0), tower_passes(1), tower_passes(4)) == (1, 2, 2)
    path = tiny_vl_families["qwen2_5_vl"]
    enc = _encoder(path)
    records = _records(tmp_path)
    only_video, both, text = (enc.encode(r) for r in records)
    batches = [collate_train(_samples([p, p, p])[:1], int(enc.tokenizer.pad_token_id))
               for p in (only_video, both, text)]
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    plain = [model(**b.model_inputs).logits for b in batches]
    calls: list[int] = []
    model.model.visual.blocks[0].register_forward_hook(lambda *_: calls.append(1))
    assert keep_vision_in_step(model, tower_passes(2))
    for batch, want in zip(batches, plain, strict=True):
        calls.clear()
        with torch.no_grad():
            got = model(**batch.model_inputs).logits
        assert len(calls) == 2
        assert torch.equal(got, want)


def test_a_video_rank_beside_a_text_only_rank_matches_one_process(
    tiny_vl_families: dict[str, Path],
) -> None:
    """2 FSDP2 ranks (gloo), the tower run twice a forward: one rank's micro-batch has an
    image and videos (two real passes), the other's is text only (two zero-image passes).
    Neither hangs, and log-probs (1e-6) and gradients (1e-5 of the larger of 1 and their
    largest entry) are one process's, as tests/trainer/test_mixed_image_text.py checks
    for images."""
    from grpo_testkit.dist import run_ranks
    from grpo_testkit.video_fsdp_check import one_process_reference, video_rank

    path = tiny_vl_families["qwen2_5_vl"]
    ranks = run_ranks(video_rank, 2, {"model": str(path)}, timeout_s=180.0)
    ref = one_process_reference(path)
    for rank, out in enumerate(ranks):
        for key in ("ref", "logp"):
            for a, b in zip(out[key], ref["logp"][rank], strict=True):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    grads = ranks[0]["grads"]
    assert grads.keys() == ref["grads"].keys()
    tower = [n for n in grads if "visual" in n]
    assert tower and any(float(grads[n].abs().max()) > 0 for n in tower)
    for name, g in ref["grads"].items():
        scale = max(1.0, float(g.abs().max()))
        assert float((grads[name] - g).abs().max()) <= 1e-5 * scale, name


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_vl"])
def test_the_hf_engine_samples_video_prompts_at_the_updates_log_probs(
    tiny_vl_families: dict[str, Path], family: str, tmp_path: Path
) -> None:
    """The transformers rollout engine (lean decode, the model loaded as the trainer loads
    it) generates from video prompts beside a text one, and its log-probs of what it drew
    are the packed update's recomputation (temperature 1, no top-p): the same frames and
    positions on both sides."""
    from grpo_api.trainer_config import ModelConfig
    from grpo_trainer.model.modeling import load_full
    from grpo_trainer.rollout.base import SamplingSpec
    from grpo_trainer.rollout.hf import HFGenerateEngine

    path = tiny_vl_families[family]
    enc = _encoder(path)
    prompts = [enc.encode(r) for r in _records(tmp_path)]
    pad = int(enc.tokenizer.pad_token_id)
    model = load_full(ModelConfig(path=str(path)), torch.float32)
    engine = HFGenerateEngine(model, pad, [int(enc.tokenizer.eos_token_id)])
    spec = SamplingSpec(n=2, temperature=1.0, top_p=1.0, max_new_tokens=6, seed=3)
    groups = engine.generate(prompts, spec)
    samples = [Sample(p, g.token_ids, g.log_probs, g.finished)
               for p, gens in zip(prompts, groups, strict=True) for g in gens]
    assert all(s.response_ids.numel() > 0 for s in samples)
    rope = rope_index_of(model)
    packed = collate_packed(samples, pad, torch.float32, rope)
    for recomputed, s in zip(_log_probs(model, packed), samples, strict=True):
        torch.testing.assert_close(recomputed, s.rollout_log_probs, atol=1e-5, rtol=0)
