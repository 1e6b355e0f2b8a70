"""A Qwen2.5-VL run with images: rollout, log-prob recomputation, KL to a reference, update."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from grpo_testkit.datasets import write_vision_task
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.rank.worker import Worker

pytestmark = pytest.mark.trainer


def test_vlm_steps_with_images_and_kl(tiny_vlm: Path, tmp_path: Path, ray_local: None) -> None:
    data = write_vision_task(tmp_path / "vision.parquet")
    cfg = build_config(
        {
            "model": {"path": str(tiny_vlm)},
            "data": {"train_files": [str(data)], "format_prompt": "math"},
            "rollout": {"n": 4, "max_new_tokens": 6},
            "algorithm": {"kl_coef": 0.1, "kl_estimator": "low_var_kl"},
            # bf16 compute with fp32 master weights, as on GPUs.
            "actor": {"lr": 1e-3, "micro_batch_size": 2, "mini_batch_size": 4, "dtype": "bfloat16"},
            "reward": {"type": "math"},
            "resources": {"num_workers": 2, "ray_address": "local"},
            "trainer": {"total_steps": 2, "rollout_batch_size": 2},
            "metrics": {"progress_bar": "off"},
        },
        environ={},
    )
    before, history, after, gaps = _train(cfg)

    assert len(history) == 2
    for m in history:
        assert all(math.isfinite(v) for k, v in m.items() if k != "reward/accuracy")
        # Two mini-batches of 4 samples out of 2 prompts x 4 generations.
        assert m["actor/optimizer_steps"] == 2
    # The vision tower and the language model were both trained.
    assert any(k.startswith("model.visual") for k in before)
    changed = {k for k in before if not (before[k] == after[k]).all()}
    assert any("visual" in k for k in changed) and any("language_model" in k for k in changed)
    # After the first update the reference and the actor differ: KL is measured.
    assert history[1]["actor/kl"] > 0
    # bf16 compute on both sides: agreement to bf16 precision.
    assert max(gaps) < 0.5


def test_vlm_lora_trains_the_language_model_only(
    tiny_vlm: Path, tmp_path: Path, ray_local: None
) -> None:
    """LoRA on Qwen2.5-VL: adapters on the language model's linear layers only (the
    default exclude_modules keeps the vision tower out), the base frozen, bf16 compute,
    the reference the actor with its adapters off."""
    data = write_vision_task(tmp_path / "vision.parquet")
    cfg = build_config(
        {
            "model": {"path": str(tiny_vlm)},
            "data": {"train_files": [str(data)], "format_prompt": "math"},
            "rollout": {"n": 4, "max_new_tokens": 6},
            # The entropy bonus gives the adapters a gradient whatever the tiny
            # model's rewards (mostly all zero: no advantage, no policy gradient).
            "algorithm": {"kl_coef": 0.1, "kl_estimator": "low_var_kl", "entropy_coef": 0.01},
            "actor": {
                "lr": 5e-2,
                "micro_batch_size": 2,
                "mini_batch_size": 4,
                "dtype": "bfloat16",
                "lora": {"rank": 4, "alpha": 8.0},
            },
            "reward": {"type": "math"},
            "resources": {"num_workers": 2, "ray_address": "local"},
            "trainer": {"total_steps": 2, "rollout_batch_size": 2},
            "metrics": {"progress_bar": "off"},
        },
        environ={},
    )
    before, history, after, gaps = _train(cfg)

    adapters = {k for k in before if ".lora_" in k}
    assert adapters and all("language_model" in k for k in adapters)
    changed = {k for k in before if not (before[k] == after[k]).all()}
    assert changed and changed <= adapters  # the base, vision tower included, is untouched
    assert any(".lora_B." in k for k in changed)
    assert history[1]["actor/kl"] > 0
    assert max(gaps) < 0.5


def _train(cfg: Any) -> tuple[dict[str, Any], list[dict[str, float]], dict[str, Any],
                              list[float]]:
    """(full params before, per-step metrics, full params after, rollout log-prob gaps)."""
    trainer = GRPOTrainer(cfg)
    try:
        trainer.start()
        assert trainer.group is not None
        before = trainer.group.call(Worker.full_params)[0]
        history = trainer.run()
        after = trainer.group.call(Worker.full_params)[0]
        gaps = trainer.group.call(Worker.rollout_log_prob_gap)
    finally:
        trainer.close()
    return before, history, after, gaps
