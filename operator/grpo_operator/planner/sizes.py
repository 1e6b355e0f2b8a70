"""Bytes of one token, one tensor, one weight sync: the formulas the memory model
(stage_terms.compute_budget) sums per stage. docs/memory-model.md derives each."""

from __future__ import annotations

from grpo_api.contract import WEIGHT_SYNC_BUCKET_BYTES
from grpo_api.model import kv_cache
from grpo_api.model.shape import Shape
from grpo_api.model.units import BF16_B, FP32_B

from .types import Geometry

# The update's log-probs (trainer lean_logprobs.ChunkedHead; docs/memory-model.md,
# "Logits"): LM head, temperature, log-softmax and entropy on the response positions
# only, actor.logprob_chunk_tokens at a time, recomputed in backward. A chunk's peak is
# two float32 [chunk, V] buffers and at most four float32 scalars per chunk token; each
# response token keeps its hidden state (compute dtype) and int64 label to backward,
# where its hidden state's gradient joins them. Measured on CPU in every mode by the
# plan-equals-tensors test. The full logits it replaced took 25.7-29.2 B per response
# token per vocabulary entry on an H100 at prompt = response, growing with the prompt.
LOGPROB_CHUNK_B = 8  # per chunk token per vocabulary entry
LOGPROB_CHUNK_SCALARS_B = 16  # per chunk token
LOGPROB_LABEL_B = 8  # per response token: its int64 label
LOGPROB_STATS_B = 8  # per response token: its log-sum-exp and E_p[z], float32


def compute_bytes(geo: Geometry) -> int:
    """The compute dtype's size: what FSDP gathers, and what frozen copies are kept in
    (the trainer's actor.dtype: bfloat16 on GPUs, float32 on CPU ranks)."""
    return BF16_B if geo.is_gpu else FP32_B

def logprob_bytes(
    shape: Shape, compute_b: int, chunk: int, response_tokens: int, *, trained_head: bool,
) -> float:
    """The update's log-prob head at its peak (backward: each response token's hidden
    state, label and hidden-state gradient; one chunk's float32 buffers), bytes. Bounded
    by the chunk and the response: no term grows with the prompt. A trained head (not
    LoRA's) computed below float32 makes its weight gradient over more than one chunk by
    vocabulary slices (``ChunkedHead.backward``: rounded once, not once per chunk), from
    two float32 statistics per response token."""
    c = min(chunk, response_tokens)
    per_token = 2 * compute_b * shape.hidden_size + LOGPROB_LABEL_B
    if trained_head and compute_b < FP32_B and response_tokens > chunk:
        per_token += LOGPROB_STATS_B
    return response_tokens * per_token + c * (
        LOGPROB_CHUNK_B * shape.vocab_size + LOGPROB_CHUNK_SCALARS_B)


def weight_sync_bytes(geo: Geometry) -> float:
    """What one rank holds while it brings the rollout engine to the actor's weights,
    beside its resident state, bytes in the compute dtype (trainer param_gather,
    lora/sync.py, the engine's load). Each bucket of full parameters
    (WEIGHT_SYNC_BUCKET_BYTES, or one larger tensor alone) is all-gathered from this
    rank's flat slice of it, kept until the bucket is done (1/W more); each tensor is
    then copied out of the gathered rows (a reshape of strided rows, on 2 ranks or more)
    and vLLM's loader takes a copy of that (the transformers engine copies into its own
    weights instead). With T the largest tensor: ``max(T, bucket) (1 + 1/W) + 2 T``
    (Qwen2.5-VL-7B on 8 GPUs: 3.2 GiB; 72B: 7.3 GiB). vLLM with LoRA gathers the adapters
    only and holds all of them at once, beside the copy out of the gathered rows of the
    one being taken (at most rank x the widest linear's features)."""
    c, w = compute_bytes(geo), geo.world_size
    if geo.lora is not None and geo.uses_vllm:
        s = geo.shape
        adapters = geo.lora.adapter_parameters * c
        widest = max(s.hidden_size, s.intermediate_size, s.attention_heads * s.head_dim)
        copy = geo.lora.rank * widest * c if w > 1 else 0
        return adapters + min(WEIGHT_SYNC_BUCKET_BYTES, adapters) * (1 + 1 / w) + copy
    largest = geo.shape.largest_tensor_parameters * c
    bucket = min(WEIGHT_SYNC_BUCKET_BYTES, geo.shape.parameters * c)
    copies = (1 if w > 1 else 0) + (1 if geo.uses_vllm else 0)
    return max(largest, bucket) * (1 + 1 / w) + copies * largest


def activation_bytes_per_token(geo: Geometry, checkpointing: bool) -> float:
    """LM activations kept for backward, per token, all layers (bf16, flash attention).

    One SwiGLU decoder layer stores ~(20 h + 6 I) bytes per token (Korthikanti et al. 2022
    adapted: no s^2 attention term with flash attention, no dropout masks). With
    checkpointing only each layer's input (2 h bytes) is kept, plus one layer recomputed.
    """
    s = geo.shape
    per_layer = 20 * s.hidden_size + 6 * s.intermediate_size
    if geo.lora is not None:  # each adapter keeps its rank-r bf16 bottleneck for B's grad
        per_layer += 2 * geo.lora.rank * geo.lora.adapted_per_layer
    if checkpointing:
        return s.layers * 2 * s.hidden_size + per_layer
    return s.layers * per_layer


def vision_activation_bytes(geo: Geometry, checkpointing: bool) -> float:
    """Vision tower activations for one sample's image at max_pixels."""
    s = geo.shape
    if s.vision_parameters == 0:
        return 0.0
    patches = geo.max_pixels / (s.patch_size**2)
    per_layer = 20 * s.vision_hidden + 6 * s.vision_intermediate
    kept = (
        s.vision_layers * 2 * s.vision_hidden + per_layer
        if checkpointing
        else (s.vision_layers * per_layer)
    )
    return patches * kept


def kv_bytes_per_token(geo: Geometry) -> float:
    """K and V of one token over the whole model, bf16 (vLLM's cache dtype on a GPU)."""
    s = geo.shape
    return kv_cache.kv_bytes_per_token(s.layers, s.kv_heads, s.head_dim, BF16_B)
