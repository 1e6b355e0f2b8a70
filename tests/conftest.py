"""Tier markers follow the directory a test lives in, so `-m unit` etc. always work; the
tiny models the rollout engines' tiers share (`vllm`, `gpu`)."""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "trainer", "vllm", "cluster", "e2e", "images", "gpu")
_DIR_TIER = {"unit": "unit", "trainer": "trainer", "vllm": "vllm", "cluster": "cluster",
             "e2e": "e2e", "images": "images", "gpu": "gpu"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = Path(__file__).parent
    for item in items:
        own = {m.name for m in item.iter_markers() if m.name in TIERS}
        rel = Path(str(item.fspath)).relative_to(root)
        tier = _DIR_TIER.get(rel.parts[0]) if len(rel.parts) > 1 else None
        if tier and tier not in own and "gpu" not in own:
            item.add_marker(getattr(pytest.mark, tier))


# The engine tiers' tiny models (grpo_trainer.testing.tiny_models), one session copy each.
# vLLM's CPU attention refuses head_dim 16 (the trainer tier's tiny models): 4 heads of 32.
VLLM_CPU_HIDDEN = 128
# On CUDA head_dim 64 (4 heads of 256): within every vLLM CUDA attention backend's sizes.
GPU_HIDDEN = 256


def _tiny(factory: pytest.TempPathFactory, kind: str, name: str, hidden: int,
          **kw: float) -> Path:
    from grpo_trainer.testing.tiny_models import build_tiny_qwen2, build_tiny_qwen2_5_vl

    build = build_tiny_qwen2 if kind == "lm" else build_tiny_qwen2_5_vl
    return Path(build(factory.mktemp(name), hidden=hidden, **kw))


@pytest.fixture(scope="session")
def vllm_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "lm", "vllm-qwen2", VLLM_CPU_HIDDEN)


@pytest.fixture(scope="session")
def vllm_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "vlm", "vllm-qwen2.5-vl", VLLM_CPU_HIDDEN)


@pytest.fixture(scope="session")
def vllm_lora_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Weights at scale 0.1: at 0.02 the frozen head leaves LoRA too little room to
    learn the text task (``build_tiny_qwen2``)."""
    return _tiny(tmp_path_factory, "lm", "vllm-lora-qwen2", VLLM_CPU_HIDDEN, init_std=0.1)


@pytest.fixture(scope="session")
def gpu_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "lm", "gpu-qwen2", GPU_HIDDEN)


@pytest.fixture(scope="session")
def gpu_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny(tmp_path_factory, "vlm", "gpu-qwen2.5-vl", GPU_HIDDEN)
