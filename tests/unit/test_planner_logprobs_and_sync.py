"""Two planner terms of the rank's transients (docs/memory-model.md): the update's
log-prob head, bounded by its chunk and the response, never by the prompt; and the
weight sync's gather buffers, in the rollout phase (its ``weight_sync`` moment)."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_api.contract import WEIGHT_SYNC_BUCKET_BYTES, FailureReason, RankStage
from grpo_api.job import parse_spec
from grpo_api.trainer_config import LOGPROB_CHUNK_TOKENS
from grpo_operator.planner import plan_memory
from grpo_operator.planner.budget import GIB
from grpo_operator.planner.headroom import headroom
from grpo_operator.planner.sizes import logprob_bytes, weight_sync_bytes

pytestmark = pytest.mark.unit

QWEN_VOCAB, QWEN7B_HIDDEN = 152064, 3584


def _job(size: str = "7B", prompt: int = 2048, response: int = 2048, gpus: int = 8,
         lora: bool = False, precision: str = "mixed", **memory: Any) -> Any:
    return plan_memory(parse_spec({
        "model": {"path": f"Qwen/Qwen2.5-VL-{size}-Instruct"},
        "data": {"train": "hiyouga/geometry3k@train", "maxPromptLength": prompt,
                 "maxResponseLength": response, "maxPixels": 4194304},
        "algorithm": {"rolloutN": 5, "klCoef": 0.01},
        "training": {"rolloutBatchSize": 512, "globalBatchSize": 128, "precision": precision},
        **({"lora": {}} if lora else {}),
        "resources": {"gpuType": "H100-80GB", "nodes": max(1, gpus // 8),
                      "gpusPerNode": min(gpus, 8)},
        "checkpoint": {"size": "1Ti"},
        "memory": memory,
    }))


def test_the_logits_term_does_not_grow_with_the_prompt() -> None:
    """The issue's example: 7B at micro-batch 2, response 1024, after a 1024- and a
    4096-token (image-heavy) prompt. The full logits grew with prompt + response: 9.3 GB
    planned against ~23 GB needed there."""
    short = _job(prompt=1024, response=1024, microBatchSize=2)
    long = _job(prompt=4096, response=1024, microBatchSize=2)
    logits = long.budget.gpu_stages["training"]["logits"]
    assert logits == short.budget.gpu_stages["training"]["logits"]
    # One 512-token chunk of two float32 [chunk, V] buffers, and 2 x 1024 response
    # tokens' hidden states (bf16), labels and hidden-state gradients; over 4 chunks
    # the head's weight gradient takes two float32 statistics per token.
    per_token = 2 * 2 * QWEN7B_HIDDEN + 8 + 8
    want = 2 * 1024 * per_token + LOGPROB_CHUNK_TOKENS * (8 * QWEN_VOCAB + 16)
    assert logits * GIB == pytest.approx(want)
    assert 0.6 < logits < 0.62  # GiB; the full logits: 30 B x 2048 x 152064 = 8.7 GiB


def test_the_chunk_bounds_the_buffers_and_short_responses_take_less() -> None:
    shape = _job().geometry.shape
    per_chunk_token = 8 * shape.vocab_size + 16
    tokens = 2 * 64  # two 64-token responses: a chunk of 128, not 512
    # One chunk: the head's gradient is one matmul, trained or not.
    assert logprob_bytes(shape, 2, 512, tokens, trained_head=True) == tokens * (
        4 * shape.hidden_size + 8) + tokens * per_chunk_token
    # Doubling the response adds the per-token terms only, once past the chunk.
    grown = (logprob_bytes(shape, 2, 512, 4096, trained_head=True)
             - logprob_bytes(shape, 2, 512, 2048, trained_head=True))
    assert grown == 2048 * (4 * shape.hidden_size + 8 + 8)


def test_the_weight_sync_holds_three_largest_tensors_beside_the_resident_state() -> None:
    """The embeddings (7B: 545M parameters, 1.0 GiB in bf16, on 8 ranks; 72B: 2.3 GiB,
    on 16) alone in their bucket: gathered, this rank's slice of them, the copy out of
    the gathered rows and vLLM's copy of that."""
    for size, gpus, gib in (("7B", 8, 3.17), ("72B", 16, 7.11)):
        geo = _job(size, gpus=gpus).geometry
        largest = geo.shape.vocab_size * geo.shape.hidden_size * 2
        assert largest > WEIGHT_SYNC_BUCKET_BYTES
        w = geo.world_size
        assert weight_sync_bytes(geo) == largest * (1 + 1 / w) + 2 * largest
        assert weight_sync_bytes(geo) / GIB == pytest.approx(gib, abs=0.01)
    plan = _job("7B")
    assert not plan.settings.offload_params
    sync = plan.budget.gpu_stages["weight_sync"]
    assert sync["weight_sync_buffers"] == pytest.approx(3.17, abs=0.01)
    rollout = plan.budget.gpu_stages["rollout"]
    # The moment of the sync: the engine's weights back, its KV cache still asleep.
    for term in ("cuda_context", "actor_resident", "reference_model_shard", "vllm_weights"):
        assert sync[term] == rollout[term]
    assert "vllm_kv_cache_and_overhead" not in sync


def test_a_rollout_oom_counts_the_weight_sync() -> None:
    parts = headroom(_job(), FailureReason.CUDA_OOM, RankStage.ROLLOUT)
    assert set(parts) == {"gpu.weight_sync", "gpu.rollout"}


def test_lora_with_vllm_syncs_only_the_adapters() -> None:
    plan = _job(lora=True)
    adapters = plan.geometry.lora.adapter_parameters * 2
    sync = plan.budget.gpu_stages["weight_sync"]["weight_sync_buffers"] * GIB
    assert 2 * adapters < sync < 3 * adapters < 0.5 * GIB


def test_offloaded_parameters_sync_in_host_ram_where_the_gradients_were() -> None:
    """With the shards in host RAM the gather runs there, after the update freed its
    offloaded gradients: the host counts only what the sync holds beyond those. 7B in
    bf16 on 8 ranks: a 1.8 GiB gradient shard, a 3.1 GiB sync."""
    plan = _job(precision="bf16", offloadParams=True, offloadOptimizer=True)
    assert plan.budget.gpu_stages["weight_sync"]["weight_sync_buffers"] == 0
    geo = plan.geometry
    grads = geo.shape.parameters / geo.world_size * 2 / GIB
    excess = weight_sync_bytes(geo) / GIB - grads
    assert 1.2 < excess < 1.3
    assert plan.budget.host_terms["weight_sync_buffers"] == pytest.approx(
        geo.ranks_per_node * excess)
    mixed = _job(offloadParams=True, offloadOptimizer=True)  # a 3.5 GiB float32 shard
    assert mixed.budget.host_terms["weight_sync_buffers"] == 0


def test_vllms_cuda_graphs_wait_in_host_ram_while_it_sleeps() -> None:
    """The trainer sleeps vLLM with sleep_mode_offload_cudagraph (vllm_engine.
    engine_kwargs; vllm/config/model.py:380 and vllm/device_allocator/cumem.py:265-276 at
    0.32.0: the graph pool is copied to pinned host memory at every sleep): each GPU rank's
    pool is a host term, beside its freed share of the GPU, never on the GPU through the
    update. The transformers engine captures no graphs."""
    from grpo_operator.planner.budget import VLLM_CUDA_GRAPHS_GIB

    vllm = _job()
    assert vllm.budget.host_terms["vllm_sleep_cuda_graphs"] == pytest.approx(
        vllm.geometry.ranks_per_node * VLLM_CUDA_GRAPHS_GIB)
    assert not any("graph" in term for terms in vllm.budget.gpu_stages.values()
                   for term in terms)
    hf = plan_memory(parse_spec({
        "model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"},
        "data": {"train": "t", "maxPromptLength": 512, "maxResponseLength": 256},
        "rollout": {"engine": "hf"},
        "resources": {"gpuType": "H100-80GB", "nodes": 1, "gpusPerNode": 4},
        "checkpoint": {"size": "50Gi"},
    }))
    assert hf.budget.host_terms["vllm_sleep_cuda_graphs"] == 0.0
