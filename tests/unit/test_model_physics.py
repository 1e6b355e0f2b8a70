"""The model's physics is written once (grpo_api.model) and both sides read it: the KV
cache the trainer hands vLLM is the one the planner counts from the same config.json,
and the head size both sides derive is one rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from grpo_api.model.config_json import head_dim
from grpo_api.model.kv_cache import (
    BLOCK_ROUNDING,
    ENGINE_FIXED_BYTES,
    engine_kv_cache_bytes,
    kv_bytes_per_token,
)
from grpo_api.model.shape import shape_from_config
from grpo_testkit.tiny_configs import SUPPORTED_FAMILIES, tiny_config, write_config
from grpo_trainer.rollout.vllm_engine import kv_cache_bytes

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("family", SUPPORTED_FAMILIES)
@pytest.mark.parametrize("tp", [1, 2])
def test_the_trainers_kv_cache_is_the_one_counted_from_config_json(
        tmp_path: Path, family: str, tp: int) -> None:
    config = json.loads(write_config(tmp_path, family).read_text())
    shape = shape_from_config(config)
    assert shape.head_dim == head_dim(config)
    tokens = 3 * 300
    counted = engine_kv_cache_bytes(
        kv_bytes_per_token(shape.layers, shape.kv_heads, shape.head_dim, 4, tp), tokens)
    handed = kv_cache_bytes(tiny_config(family), torch.float32, tokens, tp)
    assert handed == counted
    # Not a tautology: the count grows with the tokens, the layers and the heads.
    per_token = 2 * shape.layers * max(1, shape.kv_heads // tp) * shape.head_dim * 4
    assert handed == int(per_token * tokens * BLOCK_ROUNDING) + ENGINE_FIXED_BYTES
