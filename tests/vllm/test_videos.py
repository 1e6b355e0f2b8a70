"""vLLM for real (CPU build) with video prompts, one engine per VLM family (Qwen2-VL,
Qwen2.5-VL, Qwen3-VL): the trainer hands over the frames it sampled and sized, with their
metadata; vLLM expands each prompt to exactly the trainer's tokens (not only as many: the
engine checks the count itself at every generate and score), generates, and scores a
response as the transformers model does on the trainer's inputs: same frames, same grids,
same temporal positions (Qwen2.5-VL's after a video: grpo_trainer/model/video_positions.py;
Qwen3-VL's <t seconds> texts). Tolerance: float32 on CPU, 2e-4 nats a token, as
tests/vllm/test_engine.py (measured ~5e-7 here; ~1e-3 on Qwen2.5-VL with transformers' own
positions). The tiny Qwen3-VL's video processor normalises with another mean than its image
processor, which vLLM's on-device normalisation would apply to videos too (0.02-0.04 nats a
token): its engine normalises on the host (grpo_trainer.media.videos.same_normalisation), the
other two families' on the device, so both paths run here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grpo_testkit.datasets import png
from grpo_testkit.dist import run_ranks
from grpo_testkit.video_check import generate_with_videos
from grpo_testkit.video_files import frame_list, write_mp4

pytestmark = pytest.mark.timeout(900)
SCORE_TOLERANCE = 2e-4
# vLLM's CPU attention takes heads of 32 at least: 4 heads (tests/conftest.py VLLM_CPU_HIDDEN).
HIDDEN = 128


@pytest.fixture(scope="module")
def vllm_vl_families(vllm_vlm: Path, tmp_path_factory: pytest.TempPathFactory
                     ) -> dict[str, Path]:
    """Each family's tiny model at the head size vLLM's CPU attention takes; Qwen2.5-VL is
    the tier's ``vllm_vlm``."""
    from grpo_testkit.tiny_models import VL_FAMILIES, build_tiny_vl

    return {f: vllm_vlm if f == "qwen2_5_vl" else
            build_tiny_vl(tmp_path_factory.mktemp(f"vllm-{f}"), f, hidden=HIDDEN)
            for f in VL_FAMILIES}


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_a_video_prompt_generates_with_the_trainers_tokens_and_log_probs(
    vllm_vl_families: dict[str, Path], family: str, tmp_path: Path
) -> None:
    mp4 = write_mp4(tmp_path / "clip.mp4", 8, 4.0, (64, 48))  # 2 s: 4 frames at 2 fps
    config: dict[str, Any] = {
        "model": {"path": str(vllm_vl_families[family])},
        "data": {"train_files": ["unused.jsonl"], "max_prompt_length": 256,
                 "max_videos_per_prompt": 2, "max_frames": 4,
                 "image_min_pixels": 28 * 28, "image_max_pixels": 2 * 28 * 28,
                 "video_min_pixels": 28 * 28, "video_max_pixels": 64 * 64},
        "rollout": {"engine": "vllm", "n": 2, "max_new_tokens": 4},
        "actor": {"dtype": "float32"},
        "resources": {"num_workers": 1},
        "trainer": {"rollout_batch_size": 2},
    }
    records = [
        {"index": 0, "problem": "<video>What happens?", "answer": "1", "videos": [str(mp4)]},
        # An image, a 3-frame list (padded to 4) and the file: two videos, one prompt.
        {"index": 1, "problem": "<image>Then <video> and <video>: which?", "answer": "2",
         "images": [png((1, 2, 3), (40, 36))], "videos": [frame_list(3, (50, 40)), str(mp4)]},
    ]
    (r,) = run_ranks(generate_with_videos, 1, {"config": config, "records": records},
                     timeout_s=900)
    print({k: r[k] for k in ("counted", "score_gap", "frames")})
    assert r["vllm_ids"] == r["trainer_ids"]
    assert r["counted"] == [len(ids) for ids in r["trainer_ids"]]
    assert [len(v) for v in r["frames"]] == [1, 2]
    assert all(shape[0] == 4 for v in r["frames"] for shape in v)
    assert [len(gens) for gens in r["generated"]] == [2, 2]
    assert all(len(g) > 0 for gens in r["generated"] for g in gens)
    assert max(r["score_gap"]) < SCORE_TOLERANCE, r["score_gap"]
    assert r["device_normalize"] == (family != "qwen3_vl")
