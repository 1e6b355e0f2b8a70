"""Training modes: what the actor keeps per parameter in each (docs/memory-model.md,
"Training modes"), and the size of a LoRA adapter from the model's shape.

mixed  fp32 master weights, fp32 gradients, fp32 Adam m and v: 16 B per parameter
       (ZeRO, Rajbhandari et al. 2020); bf16 compute copies are transient.
bf16   bf16 weights and gradients, bf16 Adam m and v and a bf16 Kahan compensation
       buffer: 10 B per parameter (EasyR1's adamw_bf16 = AnyPrecisionAdamW with Kahan
       summation; "Revisiting BFloat16 Training", arXiv 2010.06192). Gradients are
       reduce-scattered in fp32 one FSDP unit at a time, the same transient as mixed.
lora   the base frozen in bf16 (2 B per parameter, no gradient, no optimizer state) and
       the adapters trained as mixed (16 B per adapter parameter); the reference policy
       is the same model with the adapter disabled, so no reference copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from grpo_api.job.lora import LM_LINEARS, LoraSpec
from grpo_api.model.shape import Shape

Mode = Literal["mixed", "bf16", "lora"]
MIXED: Mode = "mixed"
BF16: Mode = "bf16"
LORA: Mode = "lora"
# Least change first, and least memory last: a refusal proposes the modes after the job's
# own in this order (bf16 keeps full fine-tuning, LoRA changes what is trained).
ORDER: tuple[Mode, ...] = (MIXED, BF16, LORA)

# Which budget line a state term belongs to: what offloading moves to host RAM (params
# offload moves weights, frozen weights and gradients; optimizer offload the optimizer),
# what survives into rollout (gradients are freed), what a checkpoint holds.
WEIGHTS, FROZEN, GRADS, OPTIMIZER = "weights", "frozen", "grads", "optimizer"


@dataclass(frozen=True)
class StateTerm:
    name: str  # the plan's term name (status.plan details, `grpo plan`)
    bytes_per_param: int
    kind: str  # WEIGHTS | FROZEN | GRADS | OPTIMIZER
    tensors: int = 1  # tensors per parameter (Adam: m and v), each its own allocation

    @property
    def element_bytes(self) -> int:
        """Bytes per element of each of its tensors (what pinned blocks are sized in)."""
        return self.bytes_per_param // self.tensors

    @property
    def params_offload(self) -> bool:
        return self.kind != OPTIMIZER

    @property
    def checkpointed(self) -> bool:
        """In a checkpoint (and so in the async-save staging buffer): the trained weights
        and the optimizer state. A frozen base is not: LoRA checkpoints hold adapters."""
        return self.kind in (WEIGHTS, OPTIMIZER)


STATE: dict[Mode, tuple[StateTerm, ...]] = {
    MIXED: (
        StateTerm("fp32_master_params_shard", 4, WEIGHTS),
        StateTerm("fp32_grads_shard", 4, GRADS),
        StateTerm("adam_moments_shard", 8, OPTIMIZER, tensors=2),
    ),
    BF16: (
        StateTerm("bf16_params_shard", 2, WEIGHTS),
        StateTerm("bf16_grads_shard", 2, GRADS),
        StateTerm("adam_moments_bf16_shard", 4, OPTIMIZER, tensors=2),
        StateTerm("kahan_compensation_bf16_shard", 2, OPTIMIZER),
    ),
    LORA: (
        StateTerm("frozen_base_bf16_shard", 2, FROZEN),
        StateTerm("adapter_fp32_params_shard", 4, WEIGHTS),
        StateTerm("adapter_fp32_grads_shard", 4, GRADS),
        StateTerm("adapter_adam_moments_shard", 8, OPTIMIZER, tensors=2),
    ),
}


def bytes_per_trained_param(mode: Mode) -> int:
    return sum(t.bytes_per_param for t in STATE[mode] if t.kind != FROZEN)


@dataclass(frozen=True)
class LoraPlan:
    """What the planner needs of spec.lora: the adapter's size, from the model shape."""

    rank: int
    adapter_parameters: int
    adapted_per_layer: int  # LM linears with an adapter in one decoder layer
    vision_adapted: bool  # excludeModules lets the vision tower be adapted
    unsized: tuple[str, ...] = ()  # target names the planner has no shape for


def _lm_linears(shape: Shape) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear of one decoder layer (Qwen2/2.5/3 layout). MoE
    experts are fused 3-D parameters, not nn.Linear: PEFT's all-linear leaves them out."""
    h, q, kv = shape.hidden_size, shape.attention_heads * shape.head_dim, (
        shape.kv_heads * shape.head_dim
    )
    out = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h)}
    if not shape.experts:
        i = shape.intermediate_size
        out |= {"gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}
    return out


def _vision_linears(shape: Shape) -> int:
    """sum(in + out) over the vision tower's linears: per block a fused qkv (h -> 3h),
    proj (h -> h) and a gated MLP (gate, up: h -> I; down: I -> h); then the patch
    merger's MLP (4h -> 4h -> LM hidden, 2 x 2 patches merged)."""
    h, i, merged = shape.vision_hidden, shape.vision_intermediate, 4 * shape.vision_hidden
    block = (h + 3 * h) + (h + h) + 2 * (h + i) + (i + h)
    return shape.vision_layers * block + (merged + merged) + (merged + shape.hidden_size)


def lora_plan(shape: Shape, lora: LoraSpec) -> LoraPlan:
    """Adapter parameters: rank x (in + out) for every adapted linear (A is rank x in,
    B is out x rank), over all decoder layers; the vision tower only when excludeModules
    does not exclude it (module names as in Qwen2-VL/2.5-VL/3-VL: model.visual.*)."""
    linears = _lm_linears(shape)
    names = [n for n in linears if lora.adapts(f"model.language_model.layers.0.{n}")]
    per_layer = sum(sum(linears[n]) for n in names)
    total = shape.layers * lora.rank * per_layer
    vision = bool(shape.vision_parameters) and lora.adapts("model.visual.blocks.0.mlp.up_proj")
    if vision and lora.all_linear:
        total += lora.rank * _vision_linears(shape)
    known = set(LM_LINEARS)
    unsized = () if lora.all_linear else tuple(t for t in lora.target_modules if t not in known)
    return LoraPlan(lora.rank, total, len(names), vision, unsized)


def mode_of(precision: str, lora: LoraPlan | None) -> Mode:
    if lora is not None:
        return LORA
    return BF16 if precision == BF16 else MIXED


def describe(mode: Mode) -> str:
    """How a refusal and a decision name a mode."""
    return {MIXED: "mixed precision", BF16: "bf16 training", LORA: "LoRA"}[mode]

