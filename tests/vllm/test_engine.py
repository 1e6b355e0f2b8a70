"""The vLLM engine for real (vLLM's CPU backend) inside the trainer's own ranks.

Two gloo ranks run the real ``Worker``: FSDP2 actor, vLLM through the external launcher
on the trainer's process group, either one engine per rank (2 x TP 1) or one engine
sharded over both ranks (TP 2). Checked:
- sampling semantics do not depend on the layout: each prompt's samples depend on
  (seed, step, prompt) only, so TP 2 and 2 x TP 1 return the same tokens;
- the weight sync is real: after an optimizer step the engine's log-probs of the same
  tokens move with the actor. Before the sync they differ by the update (so a skipped
  sync fails), after it they equal the actor's within float32 round-off (so a sync
  from the wrong shard, or of a stale copy, fails).
Tolerance: float32 on CPU, 2e-4 nats per token (measured ~1e-5; vLLM's fused kernels
sum in another order than transformers). On GPUs in bf16 the same comparison gives
~0.05 nats (tests/gpu).
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from typing import Any

import pytest

from grpo_testkit.datasets import png
from grpo_testkit.dist import run_ranks
from grpo_testkit.vllm_check import (
    rollout_update_sync,
    rollout_update_sync_on_discarded_weights,
)
from grpo_trainer.rollout.engine_limits import VLLM_CPU_HEAD_SIZES

SYNC_TOLERANCE = 2e-4
pytestmark = pytest.mark.timeout(1800)  # each run starts vLLM on 2 ranks: minutes on 2 cores


# Images: bounds below the tiny processor's own limit (56 x 56 pixels, 4 tokens), as a
# job's maxPixels is below a real checkpoint's (12,845,056 pixels).
MIN_PIXELS, MAX_PIXELS = 28 * 28, 2 * 28 * 28
BIG = (100, 100)  # over MAX_PIXELS: 1 token at the bounds, 4 at the processor's own


def _config(model: Path, tp: int, n: int = 4) -> dict[str, Any]:
    return {
        "model": {"path": str(model)},
        "data": {"train_files": ["unused.jsonl"], "max_prompt_length": 128,
                 "image_min_pixels": MIN_PIXELS, "image_max_pixels": MAX_PIXELS},
        "rollout": {"engine": "vllm", "n": n, "max_new_tokens": 8, "tensor_parallel_size": tp},
        "actor": {"lr": 5e-2, "micro_batch_size": 4, "dtype": "float32", "weight_decay": 0.0},
        "resources": {"num_workers": 2},
        "trainer": {"rollout_batch_size": 4},
    }


def _records(images: bool) -> list[dict[str, Any]]:
    colors = [(200, 30, 30), (30, 200, 30), (30, 30, 200), (200, 200, 30)]
    return [
        {
            "index": i,
            "problem": ("<image>" if images else "") + f"What is {i} plus {i + 1}?",
            "answer": str(2 * i + 1),
            # Prompt 3's image is larger than MAX_PIXELS: the trainer resizes it.
            "images": [png(colors[i], BIG if i == 3 else (40 + 4 * i, 36))] if images else [],
        }
        for i in range(4)
    ]


def _run(model: Path, tp: int, images: bool) -> list[dict[str, Any]]:
    arg = {"config": _config(model, tp), "records": _records(images)}
    return run_ranks(rollout_update_sync, 2, arg, timeout_s=1200)


def _check_sync(results: list[dict[str, Any]], sampled_tolerance: float = SYNC_TOLERANCE) -> None:
    for r in results:
        # Nothing of the rollout is left in the sleeping engine: no vision embeddings in
        # the encoder cache (full weights and LoRA alike), no processor caches at all.
        assert r["encoder_cache_entries"] == 0, r
        assert r["mm_processor_caches"] == [], r
        # The engine sampled from the actor's weights: same log-probs for its tokens.
        assert r["rollout_vs_actor"] < sampled_tolerance, r
        assert r["synced_at_rollout"] < SYNC_TOLERANCE, r
        # The update moved the policy far beyond the tolerance; a skipped sync shows.
        assert r["policy_moved"] > 100 * SYNC_TOLERANCE, r
        assert r["stale"] > 100 * SYNC_TOLERANCE, r
        assert r["synced"] < SYNC_TOLERANCE, r


def test_text_tp2_and_2x_tp1_sample_alike_and_sync_weights(vllm_lm: Path) -> None:
    dp = _run(vllm_lm, tp=1, images=False)
    tp = _run(vllm_lm, tp=2, images=False)
    _check_sync(dp)
    _check_sync(tp)
    by_prompt_dp = {i: g for r in dp for i, g in r["generated"].items()}
    by_prompt_tp = {i: g for r in tp for i, g in r["generated"].items()}
    assert sorted(by_prompt_dp) == [0, 1, 2, 3]
    # Each rank keeps the samples of its own prompts in both layouts.
    assert [sorted(r["generated"]) for r in tp] == [[0, 1], [2, 3]]
    assert by_prompt_tp == by_prompt_dp
    # n different samples per prompt, not n copies of one.
    assert all(len({tuple(s) for s in g}) > 1 for g in by_prompt_dp.values())


def _check_one_image(results: list[dict[str, Any]]) -> None:
    """Prompt 3's image is larger than MAX_PIXELS. vLLM was given the image the trainer
    resized and the same bounds: its prompt has exactly the trainer's token count (the
    engine checks each prompt's, generating and scoring, and fails the rollout otherwise;
    the image is 1 token at the bounds, 4 at the processor's own: tests/trainer/
    test_prompt_images.py), and its log-probs agree with the actor's as closely as for the
    small images. vLLM budgets (and on a GPU profiles) its encoder for the largest image
    the bounds allow, 2 tokens, not the processor's own 4."""
    assert all(r["max_tokens_per_item"] == {"image": 2} for r in results), results
    for key in ("rollout_vs_actor_by_prompt", "scored_vs_actor_by_prompt"):
        gaps = {i: g for r in results for i, g in r[key].items()}
        small = max(gaps[i] for i in (0, 1, 2))
        assert gaps[3] <= 2 * small + 1e-5, (key, gaps)
    scored = {i: g for r in results for i, g in r["scored_vs_actor_by_prompt"].items()}
    assert max(scored.values()) < SYNC_TOLERANCE, scored


def test_vlm_with_images_syncs_weights_under_tp2(vllm_vlm: Path) -> None:
    results = _run(vllm_vlm, tp=2, images=True)
    # Sampled log-probs are of the distribution without the vision placeholder tokens
    # (never sampled: logit bias -100), renormalised: log(1 - p(placeholders)), ~0.01
    # for a random tiny model. Scoring the same tokens has no bias and agrees to 2e-4.
    print({k: [r[k] for r in results] for k in (
        "prompt_tokens", "rollout_vs_actor_by_prompt", "scored_vs_actor_by_prompt",
        "encoder_cache_entries", "mm_processor_caches", "max_tokens_per_item")})
    _check_sync(results, sampled_tolerance=0.05)
    _check_one_image(results)


def test_a_sync_rewrites_every_parameter_vllm_holds(vllm_vlm: Path) -> None:
    """What sleep level 2 (full fine-tuning on CUDA) relies on: it discards the weights,
    and the next sync must restore every parameter vLLM's model has, vision tower
    included. The engine starts with every parameter random (vLLM's dummy loader, as a
    level-2 wake leaves them); after the worker's first sync its log-probs are the
    actor's, images included, within the same tolerance as a checkpoint-loaded engine."""
    config = _config(vllm_vlm, tp=1)
    config["resources"]["num_workers"] = 1
    arg = {"config": config, "records": _records(True)}
    (result,) = run_ranks(rollout_update_sync_on_discarded_weights, 1, arg, timeout_s=1200)
    assert result["unloaded"] == []  # vLLM's own account: every parameter written
    _check_sync([result], sampled_tolerance=0.05)


def test_config_check_knows_vllms_cpu_head_sizes() -> None:
    """The config check's copy of the CPU attention head sizes is the installed vLLM's.

    Read from the source (importing vLLM costs tens of seconds on 2 cores)."""
    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).parent / "v1" / "attention" / "backends" / "cpu_attn.py"
    tree = ast.parse(source.read_text())
    found = [
        ast.literal_eval(node.value)
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef) and fn.name == "get_supported_head_sizes"
        for node in ast.walk(fn)
        if isinstance(node, ast.Return) and node.value is not None
    ]
    assert found == [list(VLLM_CPU_HEAD_SIZES)]


@pytest.mark.parametrize("tp", [1, 2])
def test_lora_adapter_sync_matches_the_actor(vllm_lm: Path, tp: int) -> None:
    """LoRA: the engine serves the base it loaded once plus the adapter sent at each
    sync (a vLLM LoRA request). Its log-probs are the actor's within SYNC_TOLERANCE
    (float32 on CPU: the same sums in another order), and a skipped adapter sync shows
    as the policy's whole move."""
    config = _config(vllm_lm, tp=tp)
    config["actor"]["lora"] = {"rank": 8, "alpha": 16.0}
    results = run_ranks(rollout_update_sync, 2, {"config": config, "records": _records(False)})
    print({k: [r[k] for r in results] for k in ("policy_moved", "stale", "synced")})
    _check_sync(results)


def test_vlm_lora_adapter_sync_with_images(vllm_vlm: Path) -> None:
    """LoRA on Qwen2.5-VL through vLLM: adapters on the language model only (vLLM adapts
    nothing else), the images through the base vision tower; synced like the text model."""
    config = _config(vllm_vlm, tp=1)
    config["actor"]["lora"] = {"rank": 8, "alpha": 16.0}
    results = run_ranks(rollout_update_sync, 2, {"config": config, "records": _records(True)})
    print({k: [r[k] for r in results] for k in ("policy_moved", "stale", "synced")})
    _check_sync(results, sampled_tolerance=0.05)
    _check_one_image(results)
