"""vLLM tier fixtures: tiny real models whose head_dim (32) vLLM's CPU attention accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

# vLLM's CPU attention refuses head_dim 16 (the trainer tier's tiny models): 4 heads of 32.
HIDDEN = 128


@pytest.fixture(scope="session")
def vllm_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_trainer.testing.tiny_models import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("vllm-qwen2"), hidden=HIDDEN)


@pytest.fixture(scope="session")
def vllm_vlm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from grpo_trainer.testing.tiny_models import build_tiny_qwen2_5_vl

    return build_tiny_qwen2_5_vl(tmp_path_factory.mktemp("vllm-qwen2.5-vl"), hidden=HIDDEN)


@pytest.fixture(scope="session")
def vllm_lora_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Weights at scale 0.1: at 0.02 the frozen head leaves LoRA too little room to
    learn the text task (``build_tiny_qwen2``)."""
    from grpo_trainer.testing.tiny_models import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("vllm-lora-qwen2"), hidden=HIDDEN, init_std=0.1)
