"""Pinned host memory as torch allocates it: what offloaded state really costs in host RAM.

torch's caching host allocator (torch 2.13, ATen/core/CachingHostAllocator.h:300-309)
rounds every pinned block up to the next power of two unless it is above
`pinned_max_round_threshold_mb` or `pinned_max_cached_size_mb`, and keeps freed blocks
cached unless they are above the cached size (`maybe_cache_block`, :734-749). Both
default to unlimited. Offloaded state goes through it tensor by tensor: FSDP2 pins
every offloaded parameter shard (`_fully_shard/_fsdp_param.py:315`, `:1045`) and copies
each gradient shard to pinned memory (`_fsdp_collectives.py:730`), the trainer moves the
Adam moments off the GPU with `non_blocking=True` (pinned by `_to_copy`), and an async
checkpoint stages each tensor with `.pin_memory()` (`distributed/_state_dict_utils.py:
437`). A 7B model's MLP shard of 34 MB became a 64 MB block: 1.9x over the whole model,
which is what the planner's byte count missed when 7B full fine-tuning was killed by
host RAM on a lent H100 (docs/benchmarks.md, "GPU fidelity").

The operator sets both limits to `PINNED_EXACT_ABOVE_MB` (grpo_api.contract): blocks
above it are exact (and freed, not cached: torch would hand a cached unrounded block to
any request of its power-of-two bucket, `get_free_block` :621-633, so rounding may only
be skipped for blocks that are never cached); smaller ones are still rounded, and this
module counts them, tensor by tensor, from the model's shape.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from grpo_api.contract import PINNED_EXACT_ABOVE_MB
from grpo_api.model.shape import Shape

from .modes import LoraPlan

EXACT_ABOVE_BYTES = PINNED_EXACT_ABOVE_MB * 2**20
Tensor = tuple[int, int]  # (rows: dim 0, which FSDP2 shards; elements per row)


def _pow2_ceil(n: int) -> int:
    return 1 << (n - 1).bit_length() if n > 1 else n


def pinned_block(nbytes: int, exact_above: float = EXACT_ABOVE_BYTES) -> int:
    """The bytes torch's host allocator takes for a pinned tensor of ``nbytes`` (blocks
    above ``exact_above`` exact: the operator's limits; torch's default is none)."""
    return nbytes if nbytes > exact_above else _pow2_ceil(nbytes)


def _linear(rows: int, cols: int, bias: bool) -> list[Tensor]:
    return [(rows, cols), *([(rows, 1)] if bias else [])]


def model_tensors(shape: Shape) -> list[Tensor]:
    """Every parameter tensor of a Qwen2/2.5/3-VL-layout model, as (rows, row size):
    decoder layers (attention with its q/k/v biases, a gated MLP or fused MoE experts,
    two norms), embeddings, LM head unless tied, and the vision tower (fused qkv,
    projection, gated MLP, norms; patch embedding and merger)."""
    h, hd = shape.hidden_size, shape.head_dim
    q, kv = shape.attention_heads * hd, shape.kv_heads * hd
    layer: list[Tensor] = [*_linear(q, h, True), *_linear(kv, h, True), *_linear(kv, h, True),
                           (h, q), (h, 1), (h, 1)]
    if shape.experts:  # fused gate-up and down per expert (dim 0: experts), the router
        attention = sum(r * c for r, c in layer)
        per_expert = max(3, (shape.layer_parameters - attention) // shape.experts)
        layer += [(shape.experts, 2 * per_expert // 3), (shape.experts, per_expert // 3),
                  (shape.experts, h)]
    else:
        i = shape.intermediate_size
        layer += [(i, h), (i, h), (h, i)]
    out = layer * shape.layers + [(shape.vocab_size, h), (h, 1)]
    if not shape.tied_embeddings:
        out.append((shape.vocab_size, h))
    if shape.vision_parameters:
        hv, iv = shape.vision_hidden, shape.vision_intermediate
        block = [*_linear(3 * hv, hv, True), *_linear(hv, hv, True), *_linear(iv, hv, True),
                 *_linear(iv, hv, True), *_linear(hv, iv, True), (hv, 1), (hv, 1)]
        merged = 4 * hv
        out += block * shape.vision_layers + [
            (hv, 6 * shape.patch_size**2), (hv, 1),
            *_linear(merged, merged, True), *_linear(h, merged, True)]
    return out


def adapter_tensors(shape: Shape, lora: LoraPlan) -> list[Tensor]:
    """A LoRA adapter's tensors: A (rank x in) and B (out x rank) of each adapted LM
    linear, per decoder layer (in + out of the adapted linears, as ``lora_plan`` sums
    them; the vision tower's adapters, when adapted, as one more such linear per block)."""
    per_layer = lora.adapter_parameters // max(1, shape.layers) // max(1, lora.rank)
    width = max(1, per_layer // max(1, 2 * lora.adapted_per_layer))
    return [(lora.rank, width), (width, lora.rank)] * (
        max(1, lora.adapted_per_layer) * shape.layers)


def pinned_factor(tensors: Iterable[Tensor], world: int, element_bytes: int,
                  exact_above: float = EXACT_ABOVE_BYTES) -> float:
    """Pinned bytes over exact bytes for one rank's FSDP2 shards of ``tensors``, each
    ``element_bytes`` per element (dim 0 split over ``world`` ranks, padded to a
    multiple of it): at least 1."""
    exact = pinned = 0
    for rows, cols in tensors:
        nbytes = math.ceil(rows / world) * cols * element_bytes
        exact += nbytes
        pinned += pinned_block(nbytes, exact_above)
    return pinned / exact if exact else 1.0
