"""GPU tier: the vLLM engine colocated with FSDP (sleep/wake, streamed weights).

Never run in CI (deselected by the `gpu` marker). On a GPU machine without vLLM the
tests fail with the install hint rather than skipping.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu


def _require_gpu_stack() -> None:
    import torch

    assert torch.cuda.is_available(), "gpu tier needs a CUDA GPU"
    hint = "install the gpu extra: uv pip install -e '.[trainer,gpu]'"
    assert importlib.util.find_spec("vllm"), hint


@pytest.mark.parametrize("vision", [False, True], ids=["qwen2", "qwen2.5-vl"])
def test_vllm_rollouts_train_and_agree_with_actor(tmp_path: Path, vision: bool) -> None:
    _require_gpu_stack()
    import ray

    from grpo_trainer.config import build_config
    from grpo_trainer.driver import GRPOTrainer, init_ray
    from grpo_trainer.testing import datasets, tiny_models

    if vision:
        model = tiny_models.build_tiny_qwen2_5_vl(tmp_path / "m", hidden=256)
        data = datasets.write_vision_task(tmp_path / "d.parquet")
        reward = {"type": "math"}
    else:
        model = tiny_models.build_tiny_qwen2(tmp_path / "m", hidden=256)
        data = datasets.write_text_task(tmp_path / "d.jsonl")
        reward = {"type": "function",
                  "function": "grpo_trainer.testing.rewards:target_token_reward"}
    cfg = build_config({
        "model": {"path": str(model)},
        "data": {"train_files": [str(data)]},
        "rollout": {"engine": "vllm", "n": 4, "max_new_tokens": 16,
                    "gpu_memory_utilization": 0.3},
        "actor": {"lr": 1e-4, "micro_batch_size": 4, "dtype": "bfloat16"},
        "algorithm": {"kl_coef": 0.05},
        "reward": reward,
        "resources": {"num_workers": 1, "gpus_per_worker": 1, "ray_address": "local"},
        "trainer": {"total_steps": 3, "rollout_batch_size": 2},
        "metrics": {"progress_bar": "off"},
    }, environ={})
    init_ray(cfg)
    trainer = GRPOTrainer(cfg)
    try:
        history = trainer.run()
    finally:
        trainer.close()
        ray.shutdown()
    assert len(history) == 3
    # Weights streamed into vLLM each step: its log-probs track the updated actor.
    for m in history:
        assert m["rollout/logprob_abs_diff_mean"] < 0.05, m
    assert history[-1]["actor/kl"] > 0
