"""Model size and shape: from `spec.model.shape`, from config.json (the families of
families.py), or from a table of known families by name."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from grpo_api.job.spec import ModelSpec

from .config_json import head_dim as config_head_dim
from .config_json import text_fields
from .families import Family, family_of


@dataclass(frozen=True)
class Shape:
    """What the memory model needs to know about a VLM (counts, not bytes)."""

    parameters: int
    vision_parameters: int
    layers: int
    hidden_size: int
    intermediate_size: int
    attention_heads: int
    kv_heads: int
    head_dim: int
    vocab_size: int
    tied_embeddings: bool = False
    # Vision tower geometry, for its activations (Qwen2.5-VL's tower when unknown).
    vision_layers: int = 32
    vision_hidden: int = 1280
    vision_intermediate: int = 3420
    patch_size: int = 14
    experts: int = 0  # MoE: experts per layer (0 = dense)
    # One vision block's parameters; 0: estimated from the tower's width (gated MLP).
    vision_block: int = 0

    @property
    def layer_parameters(self) -> int:
        """Parameters of one decoder layer: FSDP all-gathers one such unit at a time."""
        lm = self.parameters - self.vision_parameters - self.embedding_parameters
        return max(1, lm // self.layers)

    @property
    def embedding_parameters(self) -> int:
        """Input embeddings and LM head (one matrix when tied)."""
        return self.vocab_size * self.hidden_size * (1 if self.tied_embeddings else 2)

    @property
    def head_parameters(self) -> int:
        """The output projection (the input embeddings when tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def largest_tensor_parameters(self) -> int:
        """The largest single parameter: the embeddings or LM head (V x h) for every
        known model; the others bound it for small or unusual shapes: an MLP projection
        (I x h), the vision tower's patch embedding (3 channels x 2 frames x patch^2 x
        hv), its merger's first linear ((4 hv)^2), none larger than the tower (whose
        width is Qwen2.5-VL's when unknown), and an MoE layer's fused experts (gate-up:
        2/3 of the experts' weights, so at most 2/3 of the layer)."""
        vision = min(self.vision_parameters, max(6 * self.patch_size**2 * self.vision_hidden,
                                                 16 * self.vision_hidden**2))
        fused = 2 * self.layer_parameters // 3 if self.experts else 0
        mlp = self.intermediate_size * self.hidden_size
        return max(self.head_parameters, mlp, vision, fused)

    @property
    def vision_block_parameters(self) -> int:
        if not self.vision_parameters:
            return 0
        return self.vision_block or vision_block_parameters(
            self.vision_hidden, self.vision_intermediate, gated=True)

    @property
    def block_parameters(self) -> int:
        """The largest FSDP unit but the root: a decoder layer or a vision block."""
        return max(self.layer_parameters, self.vision_block_parameters)

    @property
    def root_parameters(self) -> int:
        """What the trainer's root FSDP unit holds: everything outside the decoder layers
        and vision blocks (embeddings, LM head, final norm, patch embedding, merger)."""
        blocks = self.layers * self.layer_parameters
        blocks += self.vision_layers * self.vision_block_parameters
        return max(self.embedding_parameters, self.parameters - blocks)


def vision_block_parameters(hidden: int, intermediate: int, gated: bool) -> int:
    """One vision block: fused qkv and proj with biases, two norms and the MLP (with
    biases). Qwen2.5-VL: RMSNorm and a gated SiLU MLP (gate, up, down); Qwen2-VL and
    Qwen3-VL: LayerNorm (weight and bias) and a two-layer MLP (fc1, fc2)."""
    h, i = hidden, intermediate
    norms = 2 * (h if gated else 2 * h)
    mlp = 3 * h * i + 2 * i + h if gated else 2 * h * i + i + h
    return 4 * h * h + 4 * h + norms + mlp


@dataclass(frozen=True)
class ResolvedShape:
    shape: Shape
    source: str  # one line: where the numbers came from


def _experts(t: dict[str, Any]) -> int:
    # transformers 5 writes Qwen3-VL MoE's count as num_local_experts; Qwen's own
    # config.json files say num_experts.
    return int(t.get("num_experts") or t.get("num_local_experts") or 0)


def _lm_parameters(t: dict[str, Any], head_dim: int, family: Family) -> int:
    h, layers, vocab = t["hidden_size"], t["num_hidden_layers"], t["vocab_size"]
    heads, kv = t["num_attention_heads"], t.get("num_key_value_heads", t["num_attention_heads"])
    attn = h * heads * head_dim * 2 + h * kv * head_dim * 2
    if t.get("attention_bias", family.qkv_bias):
        attn += (heads + 2 * kv) * head_dim  # q, k, v biases (Qwen2); o_proj has none
    if family.qk_norm:
        attn += 2 * head_dim  # Qwen3's per-head RMSNorm of queries and keys
    experts = _experts(t)
    if experts:  # fused gate_up and down per expert, and the router
        mlp = experts * 3 * h * int(t["moe_intermediate_size"]) + h * experts
    else:
        mlp = 3 * h * int(t["intermediate_size"])
    embed = vocab * h * (1 if t.get("tie_word_embeddings", False) else 2)
    return int(layers * (attn + mlp + 2 * h) + embed + h)


@dataclass(frozen=True)
class _Tower:
    parameters: int
    layers: int
    hidden: int
    intermediate: int
    patch: int
    block: int


def _vision(v: dict[str, Any], out_hidden: int, tower: str) -> _Tower:
    """The vision tower: its blocks, the patch merger (a norm, then an MLP from the
    merged patches' width to the LM's) and the patch embedding (a 3-D convolution over
    `temporal_patch_size` frames). Qwen2.5-VL: RMSNorm and a gated SiLU MLP; Qwen2-VL and
    Qwen3-VL: LayerNorm and a two-layer MLP. Qwen3-VL adds a learned position embedding,
    a bias on the patch embedding and one merger per deepstack layer (their norm over
    the merged width)."""
    layers = int(v.get("depth", v.get("num_hidden_layers", 32)))
    # Qwen2-VL names the tower width embed_dim (its hidden_size is the merger's output).
    hidden = int(v.get("embed_dim") or v.get("hidden_size", 1280))
    inter = int(v.get("intermediate_size") or hidden * v.get("mlp_ratio", 4))
    merge = int(v.get("spatial_merge_size", 2))
    out = int(v.get("out_hidden_size") or out_hidden)
    patch = int(v.get("patch_size", 14))
    gated = tower == "qwen2_5_vl"
    block = vision_block_parameters(hidden, inter, gated)
    m = hidden * merge * merge
    mlp = m * m + m + m * out + out
    merger = (hidden if gated else 2 * hidden) + mlp
    embed = int(v.get("in_channels", 3)) * int(v.get("temporal_patch_size", 2)) * patch**2 * hidden
    if tower == "qwen3_vl":
        embed += hidden + int(v.get("num_position_embeddings", 0)) * hidden
        merger += len(v.get("deepstack_visual_indexes") or []) * (2 * m + mlp)
    return _Tower(layers * block + merger + embed, layers, hidden, inter, patch, block)


def shape_from_config(config: dict[str, Any]) -> Shape:
    """Parse a HF config.json dict of a family the trainer trains (UnsupportedArchitecture
    otherwise). Newer transformers nest the LM under text_config."""
    family = family_of(config)
    text = text_fields(config)
    missing = [
        k
        for k in ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
        if k not in text
    ]
    if missing:
        raise ValueError(f"config.json lacks {', '.join(missing)} (looked in text_config too)")
    if "intermediate_size" not in text and "moe_intermediate_size" not in text:
        raise ValueError("config.json lacks intermediate_size")
    h, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
    head_dim = config_head_dim(config) or h // heads
    vision = config.get("vision_config") or {}
    if family.tower is not None and not vision:
        raise ValueError(f"config.json of a {family.name} model lacks vision_config")
    tower = _vision(vision, h, family.tower) if family.tower else _Tower(0, 0, 0, 0, 14, 0)
    lm = _lm_parameters(text, head_dim, family)
    experts = _experts(text)
    inter = int(text.get("intermediate_size") or 0)
    if experts:  # activations see only the routed experts' width
        inter = int(text["moe_intermediate_size"]) * int(text.get("num_experts_per_tok", 8))
    return Shape(
        parameters=lm + tower.parameters,
        vision_parameters=tower.parameters,
        layers=int(text["num_hidden_layers"]),
        hidden_size=h,
        intermediate_size=inter,
        attention_heads=heads,
        kv_heads=int(text.get("num_key_value_heads", heads)),
        head_dim=head_dim,
        vocab_size=int(text["vocab_size"]),
        tied_embeddings=bool(text.get("tie_word_embeddings", False)),
        vision_layers=tower.layers or 32,
        vision_hidden=tower.hidden or 1280,
        vision_intermediate=tower.intermediate or 3420,
        patch_size=tower.patch,
        experts=experts,
        vision_block=tower.block,
    )


def _s(
    p: float,
    vp: float,
    layers: int,
    h: int,
    inter: int,
    heads: int,
    kv: int,
    vocab: int,
    tied: bool = False,
    head_dim: int = 0,
    vision: tuple[int, int, int, bool] = (32, 1280, 3420, True),
    experts: int = 0,
) -> Shape:
    return Shape(
        parameters=int(p * 1e9),
        vision_parameters=int(vp * 1e9),
        layers=layers,
        hidden_size=h,
        intermediate_size=inter,
        attention_heads=heads,
        kv_heads=kv,
        head_dim=head_dim or h // heads,
        vocab_size=vocab,
        tied_embeddings=tied,
        vision_layers=vision[0],
        vision_hidden=vision[1],
        vision_intermediate=vision[2],
        experts=experts,
        vision_block=vision_block_parameters(vision[1], vision[2], vision[3]) if vp else 0,
    )


# Vision towers: (blocks, width, MLP width, gated MLP). Qwen2.5-VL's is gated (the
# default); Qwen2-VL's and Qwen3-VL's have a two-layer MLP.
_Q2_VIS = (32, 1280, 5120, False)
_Q3_VIS = (27, 1152, 4304, False)
_Q3_VIS_SMALL = (24, 1024, 4096, False)
# Published configs of the families we expect (parameters in billions, from the model cards).
KNOWN_MODELS: dict[str, Shape] = {
    "qwen2-vl-2b": _s(2.21, 0.675, 28, 1536, 8960, 12, 2, 151936, tied=True, vision=_Q2_VIS),
    "qwen2-vl-7b": _s(8.29, 0.675, 28, 3584, 18944, 28, 4, 152064, vision=_Q2_VIS),
    "qwen2-vl-72b": _s(73.4, 0.675, 80, 8192, 29568, 64, 8, 152064, vision=_Q2_VIS),
    "qwen2.5-vl-3b": _s(3.75, 0.67, 36, 2048, 11008, 16, 2, 151936, tied=True),
    "qwen2.5-vl-7b": _s(8.29, 0.67, 28, 3584, 18944, 28, 4, 152064),
    "qwen2.5-vl-32b": _s(33.5, 0.67, 64, 5120, 27648, 40, 8, 152064),
    "qwen2.5-vl-72b": _s(73.4, 0.67, 80, 8192, 29568, 64, 8, 152064),
    "qwen3-vl-2b": _s(2.13, 0.41, 28, 2048, 6144, 16, 8, 151936, True, 128, _Q3_VIS_SMALL),
    "qwen3-vl-4b": _s(4.44, 0.41, 36, 2560, 9728, 32, 8, 151936, True, 128, _Q3_VIS_SMALL),
    "qwen3-vl-8b": _s(8.77, 0.58, 36, 4096, 12288, 32, 8, 151936, False, 128, _Q3_VIS),
    "qwen3-vl-32b": _s(33.4, 0.58, 64, 5120, 25600, 64, 8, 151936, False, 128, _Q3_VIS),
    "qwen3-vl-30b-a3b": _s(
        31.1, 0.58, 48, 2048, 768 * 8, 32, 4, 151936, False, 128, _Q3_VIS, experts=128
    ),
    "qwen3-vl-235b-a22b": _s(
        236.0, 0.58, 94, 4096, 1536 * 8, 64, 4, 151936, False, 128, _Q3_VIS, experts=128
    ),
    # Text-only Qwen2.5 (EasyR1's math recipes and its hardware table's 1.5B column);
    # config.json values and parameter counts from the Qwen2.5 model cards.
    "qwen2.5-0.5b": _s(0.49, 0, 24, 896, 4864, 14, 2, 151936, tied=True),
    "qwen2.5-1.5b": _s(1.54, 0, 28, 1536, 8960, 12, 2, 151936, tied=True),
    "qwen2.5-3b": _s(3.09, 0, 36, 2048, 11008, 16, 2, 151936, tied=True),
    "qwen2.5-7b": _s(7.61, 0, 28, 3584, 18944, 28, 4, 152064),
    "qwen2.5-14b": _s(14.7, 0, 48, 5120, 13824, 40, 8, 152064),
    "qwen2.5-32b": _s(32.5, 0, 64, 5120, 27648, 40, 8, 152064),
    "qwen2.5-72b": _s(72.7, 0, 80, 8192, 29568, 64, 8, 152064),
}

_NAME_RE = re.compile(
    r"(qwen[23](?:\.5)?-vl-\d+b(?:-a\d+b)?|qwen2\.5-\d+(?:\.\d+)?b)",
    re.IGNORECASE,
)


def known_family(path: str) -> tuple[str, Shape] | None:
    """Match "Qwen/Qwen2.5-VL-7B-Instruct", "/models/qwen2-vl-72b", ... to the table."""
    match = _NAME_RE.search(path.rsplit("/", 1)[-1]) or _NAME_RE.search(path)
    if not match:
        return None
    key = match.group(1).lower()
    return (key, KNOWN_MODELS[key]) if key in KNOWN_MODELS else None


def resolve_shape(model: ModelSpec, config: dict[str, Any] | None = None,
                  source: str | None = None) -> ResolvedShape:
    """spec.model.shape wins, then config.json, then the known-family table. `source`
    says where config.json was read (default: beside model.path, as `grpo plan` reads
    it), or without one why none was (shown with the table's entry)."""
    if model.shape is not None:
        s = model.shape
        return ResolvedShape(
            Shape(
                parameters=s.parameters,
                vision_parameters=s.vision_parameters,
                layers=s.layers,
                hidden_size=s.hidden_size,
                intermediate_size=s.intermediate_size,
                attention_heads=s.attention_heads,
                kv_heads=s.kv_heads,
                head_dim=max(1, s.hidden_size // s.attention_heads),
                vocab_size=s.vocab_size,
            ),
            "spec.model.shape",
        )
    if config is not None:
        where = source or f"config.json ({model.path.rstrip('/')}/config.json)"
        return ResolvedShape(shape_from_config(config), where)
    known = known_family(model.path)
    if known is not None:
        return ResolvedShape(known[1], f"known table: {known[0]} "
                                       f"({source or 'no config.json read'})")
    families = ", ".join(sorted(KNOWN_MODELS))
    why = f" ({source})" if source else ""
    # A model on a claim already is where the operator reads config.json (with a pod);
    # `grpo plan` reads the claim from a local copy (--model-root).
    where = (f"make {model.path}/config.json readable on claim {model.claim_name} (`grpo "
             "plan` reads a local copy of the claim: --model-root DIR)" if model.claim_name
             else "put the model on a claim (spec.model.claimName) or the hub, where the "
             "operator reads its config.json")
    raise ValueError(
        f"spec.model: cannot size {model.path!r}: no config.json{why} and not a known "
        f"family ({families}); set spec.model.shape (parameters, layers, hiddenSize, ...), "
        f"or {where}"
    )


def scaled(shape: Shape, parameters: int) -> Shape:
    return replace(shape, parameters=parameters)
