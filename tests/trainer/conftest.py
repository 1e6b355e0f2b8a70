"""Trainer tier fixtures: tiny real models built once, one local Ray for the session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_trainer.testing.tiny_models import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(scope="session")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_trainer.testing.tiny_models import build_tiny_qwen2_5_vl

    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen2.5-vl"))


@pytest.fixture(scope="session")
def ray_local() -> Iterator[None]:
    """A real local Ray with a small object store, shared by the tier's tests."""
    import ray

    ray.init(num_cpus=4, object_store_memory=200 * 1024 * 1024, include_dashboard=False)
    yield
    ray.shutdown()


def text_config(model: Path, data: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    cfg: dict[str, Any] = {
        "model": {"path": str(model)},
        "data": {"train_files": [str(data)]},
        "rollout": {"n": 8, "max_new_tokens": 8},
        "actor": {"lr": 1e-2, "micro_batch_size": 8, "dtype": "float32", "weight_decay": 0.0},
        "reward": {
            "type": "function",
            "function": "grpo_trainer.testing.rewards:target_token_reward",
        },
        "resources": {"num_workers": 2, "ray_address": "local"},
        "trainer": {"total_steps": 2, "rollout_batch_size": 4},
        "metrics": {"progress_bar": "off"},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return cfg
