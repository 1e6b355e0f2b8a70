"""Pinned host memory: the operator's allocator limits and the planner's count of them.

torch's caching host allocator rounds pinned blocks up to a power of two; the offloaded
state of a 7B model then takes 1.9x its bytes in host RAM. The operator sets
`pinned_max_round_threshold_mb` and `pinned_max_cached_size_mb` to the same limit
(grpo_api.contract.PINNED_EXACT_ABOVE_MB), and the planner counts the rounding of the
blocks below it (planner/pinned.py). Only a GPU node pins memory, so the allocator's
behaviour is pinned here from torch's own header at our version, and the setting from
torch's own parser.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from grpo_api.contract import PINNED_EXACT_ABOVE_MB, PYTORCH_CUDA_ALLOC_CONF
from grpo_api.job import parse_spec
from grpo_operator.planner import plan_memory
from grpo_operator.planner.budget import GIB
from grpo_operator.planner.pinned import (
    EXACT_ABOVE_BYTES,
    model_tensors,
    pinned_block,
    pinned_factor,
)

pytestmark = pytest.mark.unit
MIB = 2**20


def _torch_header() -> str:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None
    path = Path(spec.origin).parent / "include/ATen/core/CachingHostAllocator.h"
    return path.read_text()


def test_torch_rounds_pinned_blocks_and_caches_them_below_its_limits() -> None:
    """torch 2.13.0, ATen/core/CachingHostAllocator.h:300-309: a block is rounded to a
    power of two unless it is above either limit; :734-749 (`maybe_cache_block`): a freed
    block above the cached size is destroyed, any other cached; :621-633
    (`get_free_block`): a cached block is handed to any request of its power-of-two bucket,
    whatever its own size. So the limits must be equal: an unrounded block that is cached
    could be handed to a larger request of its bucket."""
    src = " ".join(_torch_header().split())
    assert ("if (size <= pinned_max_round_threshold() && size <= pinned_max_cached_size()) "
            "{ return c10::llvm::PowerOf2Ceil(size);") in src
    assert "if (size > pinned_max_cached_size()) {" in src and "destroy_block(block, pool" in src
    free = re.search(r"virtual B\* get_free_block\(size_t size, BlockPool& pool\) \{(.*?)\}"
                     r" return nullptr;", src)
    assert free is not None and "block->size_" not in free.group(1), free


def test_the_operators_allocator_settings_are_what_torch_parses() -> None:
    """The env the operator injects: torch's own parser takes every key (an unknown key
    is a ValueError there), and the two pinned limits are equal."""
    torch = pytest.importorskip("torch")  # the trainer extra; always installed in CI
    before = torch._C._accelerator_getAllocatorSettings()
    try:
        torch._C._accelerator_setAllocatorSettings(PYTORCH_CUDA_ALLOC_CONF)
        assert torch._C._accelerator_getAllocatorSettings() == PYTORCH_CUDA_ALLOC_CONF
    finally:
        torch._C._accelerator_setAllocatorSettings(before or "expandable_segments:False")
    keys = dict(kv.split(":") for kv in PYTORCH_CUDA_ALLOC_CONF.split(","))
    assert keys["pinned_max_round_threshold_mb"] == keys["pinned_max_cached_size_mb"] == str(
        PINNED_EXACT_ABOVE_MB)


def test_a_pinned_block_is_exact_above_the_limit_and_a_power_of_two_below() -> None:
    assert EXACT_ABOVE_BYTES == PINNED_EXACT_ABOVE_MB * MIB
    assert pinned_block(34 * MIB) == 34 * MIB  # a 7B MLP shard on 8 ranks, fp32
    assert pinned_block(917_504) == MIB  # its k projection
    assert pinned_block(12000) == 16384 and pinned_block(4096) == 4096 and pinned_block(1) == 1
    assert pinned_block(34 * MIB, exact_above=float("inf")) == 64 * MIB  # torch's default


def test_the_factor_counts_each_ranks_shard_of_each_tensor() -> None:
    # Dim 0 split over the ranks (padded to a multiple of them), each shard its block.
    assert pinned_factor([(8, 2**18)], world=8, element_bytes=4) == 1.0  # 1 MiB: a power of 2
    assert pinned_factor([(8, 3 * 2**18)], world=8, element_bytes=4) == 1.0  # 3 MiB: exact
    assert pinned_factor([(3, 1000)], world=1, element_bytes=4) == pytest.approx(16384 / 12000)
    assert pinned_factor([(9, 1000)], world=8, element_bytes=4) == pytest.approx(8192 / 8000)


def _qwen7b(offload: str) -> object:
    return plan_memory(parse_spec({
        "model": {"path": "Qwen/Qwen2.5-VL-7B-Instruct"},
        "data": {"train": "t", "maxPromptLength": 2048, "maxResponseLength": 2048},
        "resources": {"gpuType": "A100-40GB", "nodes": 1, "gpusPerNode": 8},
        "checkpoint": {"size": "1Ti"},
        "memory": {"offloadParams": offload == "params", "offloadOptimizer": True},
    }))


def test_7b_offloaded_state_is_counted_in_pinned_blocks() -> None:
    """The lent H100's 7B full fine-tuning died of host RAM in its first step with a plan
    that counted bytes: torch's default rounding takes 1.9x the model's state here. Under
    the operator's limits what is left of it is small, and counted."""
    tensors = model_tensors(_qwen7b("params").geometry.shape)  # type: ignore[attr-defined]
    assert pinned_factor(tensors, 8, 4, exact_above=float("inf")) > 1.8  # torch's default
    factor = pinned_factor(tensors, 8, 4)
    assert 1.0 < factor < 1.01
    plan = _qwen7b("params")
    g = plan.geometry  # type: ignore[attr-defined]
    per_rank = g.shape.parameters / g.world_size / GIB
    host = plan.budget.host_terms  # type: ignore[attr-defined]
    # fp32 master weights and gradients and the bf16 reference, pinned by FSDP2; the
    # moments, created in host RAM where the step runs, plain.
    assert host["offloaded_params_and_grads"] == pytest.approx(g.ranks_per_node * per_rank * (
        8 * factor + 2 * pinned_factor(tensors, 8, 2)), rel=1e-9)
    assert host["offloaded_optimizer"] == pytest.approx(g.ranks_per_node * per_rank * 8)
    # Only the optimizer offloaded: the trainer moves the moments with non_blocking, pinned.
    moved = _qwen7b("optimizer").budget.host_terms  # type: ignore[attr-defined]
    assert moved["offloaded_optimizer"] == pytest.approx(
        g.ranks_per_node * per_rank * 8 * factor, rel=1e-9)


def test_the_trainer_image_sets_the_same_allocator_settings() -> None:
    """A rank started outside the operator (grpo-train in the image) pins alike."""
    dockerfile = (Path(__file__).resolve().parents[2] / "images/trainer/Dockerfile").read_text()
    assert f"PYTORCH_CUDA_ALLOC_CONF={PYTORCH_CUDA_ALLOC_CONF} " in dockerfile
