"""The KV cache's bytes: the planner counts them, and the trainer hands vLLM the same
number on CPU (``kv_cache_memory_bytes``; vLLM would otherwise reserve a fraction of the
host's RAM)."""

from __future__ import annotations

# vLLM allocates the cache in blocks and rounds each sequence's last block up: a quarter
# more than the tokens covers that rounding.
BLOCK_ROUNDING = 1.25
# A floor, so that a tiny job's cache still holds whole blocks.
ENGINE_FIXED_BYTES = 16 << 20


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int,
                       tensor_parallel: int = 1) -> int:
    """K and V of one token on one tensor-parallel rank: each rank holds its share of
    the KV heads (a whole head at least: vLLM replicates heads when TP exceeds them)."""
    return 2 * layers * max(1, kv_heads // tensor_parallel) * head_dim * dtype_bytes


def engine_kv_cache_bytes(per_token_bytes: float, tokens: int) -> int:
    """One engine's KV cache for ``tokens`` tokens at once (sequences x their length)."""
    return int(per_token_bytes * tokens * BLOCK_ROUNDING) + ENGINE_FIXED_BYTES
