"""What FSDP2 holds besides the shards while a micro-batch runs (docs/memory-model.md,
"FSDP2 buffers"): all-gathered units, whole-parameter gradients before their
reduce-scatter, and the float32 reduce-scatter inputs.

The trainer (``modeling.shard_model``) makes every decoder layer and vision block a unit
and leaves the rest (embeddings, LM head, final norm, patch embedding, merger) to the
root unit, which stays gathered from forward to backward. Read from torch 2.13's FSDP2
(``_fsdp_param_group.py``, ``_fsdp_collectives.py``), and measured on the tiny models
by tests/trainer/test_plan_equals_tensors.py:

- forward keeps a unit's flat all-gather output until the next unit's copy-out, so
  right after the root's all-gather the root is held twice (before any activation
  exists); later, the root plus a block and the next block's all-gather;
- backward prefetches the previous block while the current one runs; the LM head's
  gradient (computed first) stays whole until the root's own reduce at the very end, as
  does each block's until its reduce; the last block's float32 reduce-scatter input is
  kept until the next block's reduce starts;
- the root's reduce, last, copies all of its gradients into one float32 input (after
  every activation is freed).

Two terms, then: the worst moment while the blocks run (with the activations) and the
worst of the root's moments (without them), planned as two stages. Simplified: the
root's other gradients (embeddings, merger, computed late in backward) are counted only
at the root's own reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_api.model.shape import Shape

REDUCE_B = 4  # MixedPrecisionPolicy(reduce_dtype=float32): reduce-scatter inputs


@dataclass(frozen=True)
class Trained:
    """Trained (gradient-carrying) parameters per unit: everything in full fine-tuning;
    with LoRA only the adapters, which sit in the decoder layers and are gathered with
    them (the LM head is never adapted; an adapted vision tower's few adapters are left
    out)."""

    root: int
    head: int
    block: int
    adapters: int = 0  # LoRA: one decoder layer's adapters, gathered with the layer


def trained(shape: Shape, adapter_parameters: int | None) -> Trained:
    if adapter_parameters is None:
        return Trained(shape.root_parameters, shape.head_parameters, shape.block_parameters)
    per_layer = adapter_parameters // max(1, shape.layers)
    return Trained(0, 0, per_layer, per_layer)


@dataclass(frozen=True)
class Buffers:
    """FSDP2's transient bytes per rank at its worst moment in each part of a micro-batch."""

    layers: float  # while decoder layers and vision blocks run: activations are alive
    root: float  # the root's gather (start of forward) and reduce (end of backward): none are


def fsdp_buffers(shape: Shape, compute_b: int, grads: Trained) -> Buffers:
    """Walk the blocks as FSDP2 runs them: forward order is the vision blocks, then the
    decoder layers; backward the reverse. Each block is (gathered, trained) parameters."""
    c, r = compute_b, REDUCE_B
    root = shape.root_parameters
    vision = (shape.vision_block_parameters, 0 if grads.adapters else grads.block)
    layer = (shape.layer_parameters + grads.adapters, grads.block)
    n_vision = shape.vision_layers if shape.vision_parameters else 0
    n = n_vision + shape.layers
    none = (0, 0)

    def block(i: int) -> tuple[int, int]:
        return none if not 0 <= i < n else vision if i < n_vision else layer

    layers = 0
    # Two runs of equal blocks: only the positions next to an end or the seam differ.
    for i in sorted({0, 1, n_vision - 1, n_vision, n_vision + 1, n - 2, n - 1}):
        if not 0 <= i < n:
            continue
        (size, trained), prev, nxt = block(i), block(i - 1), block(i + 1)
        # prev: prefetched in backward; nxt: reduced just before this one.
        # Forward: this block and its kept all-gather output (or the next one's).
        forward = (root + size + max(size, nxt[0])) * c
        # Backward, the LM head's gradient alive throughout: before this block's reduce
        # (the next block's input still kept), and at it (its own gathered copy freed).
        whole = (grads.head + trained) * c
        before = (root + size + prev[0]) * c + whole + nxt[1] * r
        at = (root + prev[0]) * c + whole + trained * r
        layers = max(layers, forward, before, at)
    first = block(0)
    root_moment = max(
        2 * root * c,  # its flat all-gather output kept until the first block's copy-out
        (root + grads.root) * c + first[1] * r,  # before its reduce
        grads.root * (c + r),  # at its reduce, its gathered copy freed
    )
    return Buffers(float(layers), float(root_moment))
