"""One decode step of a Llama-family text model without the Hugging Face module stack.

On a CPU the per-token forward of a small model is dominated by framework overhead:
module calls, mask and cache bookkeeping, many small kernels. This step does the same
arithmetic with fewer, larger operations: q/k/v and gate/up each as one matmul over
weights laid out contiguously, RMSNorm as one fused op, queries and keys rotated
together from a cos/sin table the model's own rotary module computed once, attention
straight on the engine's KV buffers, the model's own activation. The projection
parameters become views into the fused weights, so the engine's per-step weight
refresh writes straight into them.

Only for model types whose decoder layer is exactly norm -> attention -> residual ->
norm -> gated MLP -> residual with full attention; the engine also checks the first
step against the Hugging Face forward and falls back to it on any mismatch. The VLMs'
language models (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) are such decoders: a decode step is
text, whose M-RoPE positions are one position in all three sections (the prompt's
offset added), so their rotary module's table at that position is the rotation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

SUPPORTED_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral",
                                   "qwen2_vl", "qwen2_5_vl", "qwen3_vl"})
# RoPE variants whose cos/sin depend on the position alone (not on the sequence
# length, as "dynamic" scaling does), so one table serves every step.
STATIC_ROPE_TYPES = frozenset({"default", "linear", "llama3", "yarn", "longrope"})


class KVLayer(Protocol):
    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class _Layer:
    input_norm: tuple[torch.Tensor, float]  # RMSNorm weight, eps
    post_norm: tuple[torch.Tensor, float]
    q_norm: Any | None
    k_norm: Any | None
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_weight: torch.Tensor
    o_bias: torch.Tensor | None
    gate_up_weight: torch.Tensor
    down_weight: torch.Tensor
    down_bias: torch.Tensor | None
    act: Any


def _rms(module: Any) -> tuple[torch.Tensor, float]:
    return module.weight, float(module.variance_epsilon)


def _fuse(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) of ``linears`` along the output dimension and
    re-point each parameter at its slice, so writes to either are writes to both."""
    weight = torch.cat([lin.weight.data for lin in linears])
    biases = [lin.bias for lin in linears]
    bias = torch.cat([b.data for b in biases if b is not None]) if biases[0] is not None else None
    row = 0
    for lin in linears:
        n = lin.weight.shape[0]
        lin.weight.data = weight[row : row + n]
        if bias is not None and lin.bias is not None:
            lin.bias.data = bias[row : row + n]
        row += n
    return weight, bias


def text_model(model: nn.Module) -> Any:
    """The decoder a decode step runs: a VLM's language model, or the model's own."""
    inner = getattr(model, "model", None)
    return getattr(inner, "language_model", inner)


def supports(model: nn.Module) -> bool:
    top = getattr(model, "config", None)
    if top is None or getattr(top, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    cfg = top.get_text_config()
    if getattr(cfg, "use_sliding_window", False) or any(
        t != "full_attention" for t in getattr(cfg, "layer_types", None) or []
    ):
        return False
    inner = text_model(model)
    if not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    norms = [inner.norm]
    for layer in inner.layers:
        norms += [getattr(layer, "input_layernorm", None)]
        norms += [getattr(layer, "post_attention_layernorm", None)]
    # weight * x / rms(x): the plain RMSNorm (Gemma's 1 + weight is not this).
    if not all(
        type(n).__name__.endswith("RMSNorm") and hasattr(n, "variance_epsilon") for n in norms
    ):
        return False
    for layer in inner.layers:
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        projections = [getattr(attn, p, None) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
        mlp_parts = [getattr(mlp, p, None) for p in ("gate_proj", "up_proj", "down_proj")]
        if not all(isinstance(p, nn.Linear) for p in projections + mlp_parts):
            return False
        qkv_bias = [p.bias is not None for p in projections[:3]]  # type: ignore[union-attr]
        if len(set(qkv_bias)) != 1 or any(p.bias is not None for p in mlp_parts[:2]):  # type: ignore[union-attr]
            return False
    return hasattr(model, "lm_head")


class LeanDecoder:
    """``step`` = the model's forward for one new token per row, given its KV cache."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        inner: Any = text_model(model)
        self.inner = inner
        first = inner.layers[0].self_attn
        self._table: tuple[torch.Tensor, torch.Tensor] | None = None
        self.static_rope = getattr(inner.rotary_emb, "rope_type", None) in STATIC_ROPE_TYPES
        self.head_dim = int(first.head_dim)
        self.scaling = float(first.scaling)
        top: Any = model.config
        cfg: Any = top.get_text_config()
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.layers: list[_Layer] = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv_weight, qkv_bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
            gate_up, _ = _fuse([mlp.gate_proj, mlp.up_proj])
            self.layers.append(
                _Layer(
                    input_norm=_rms(layer.input_layernorm),
                    post_norm=_rms(layer.post_attention_layernorm),
                    q_norm=attn.q_norm.forward if hasattr(attn, "q_norm") else None,
                    k_norm=attn.k_norm.forward if hasattr(attn, "k_norm") else None,
                    qkv_weight=qkv_weight,
                    qkv_bias=qkv_bias,
                    o_weight=attn.o_proj.weight,
                    o_bias=attn.o_proj.bias,
                    gate_up_weight=gate_up,
                    down_weight=mlp.down_proj.weight,
                    down_bias=mlp.down_proj.bias,
                    act=mlp.act_fn,
                )
            )
        self.final_norm = _rms(inner.norm)

    def _rotary(self, h: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """cos, sin ``[B, 1, 1, hd]`` for ``position_ids [B, 1]``, from a table of every
        position up to the largest seen (static RoPE), else from the model per step."""
        if not self.static_rope:
            cos, sin = self.inner.rotary_emb(h, position_ids)
            return cos[:, None], sin[:, None]
        top = int(position_ids.max()) + 1
        if (
            self._table is None
            or self._table[0].shape[0] < top
            or self._table[0].device != h.device
        ):
            positions = torch.arange(max(2 * top, 256), device=h.device)[None]
            cos, sin = self.inner.rotary_emb(h, positions)
            self._table = (cos[0], sin[0])
        cos_t, sin_t = self._table
        return cos_t[position_ids][:, None], sin_t[position_ids][:, None]

    def step(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor,
        cache: list[KVLayer],
        attend: torch.Tensor,
    ) -> torch.Tensor:
        """Logits ``[B, V]`` for ``tokens [B]`` at ``position_ids [B, 1]``; appends each
        layer's new key/value to ``cache``; ``attend [B, 1, 1, kv_len]`` is True where a
        row may attend (the cache after this token)."""
        b, hd = tokens.shape[0], self.head_dim
        nh, nkv = self.n_heads, self.n_kv
        h = self.inner.embed_tokens(tokens[:, None])  # [B, 1, H]
        cos, sin = self._rotary(h, position_ids)  # [B, 1, 1, hd]
        for layer, kv in zip(self.layers, cache, strict=True):
            x = F.rms_norm(h, h.shape[-1:], *layer.input_norm)
            qkv = F.linear(x, layer.qkv_weight, layer.qkv_bias).view(b, nh + 2 * nkv, 1, hd)
            if layer.q_norm is None and layer.k_norm is None:
                # Queries and keys rotated together: one set of elementwise ops.
                qk = qkv[:, : nh + nkv]
                qk = qk * cos + _rotate_half(qk) * sin
                q, k = qk[:, :nh], qk[:, nh:]
            else:
                q, k = qkv[:, :nh], qkv[:, nh : nh + nkv]
                if layer.q_norm is not None:
                    q = layer.q_norm(q)
                if layer.k_norm is not None:
                    k = layer.k_norm(k)
                q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
            keys, values = kv.update(k, qkv[:, nh + nkv :])
            # One query per row: grouped heads as the query axis, one mask for all.
            out = F.scaled_dot_product_attention(
                q.reshape(b, nkv, nh // nkv, hd),
                keys,
                values,
                attn_mask=attend,
                scale=self.scaling,
            )
            h = h + F.linear(out.reshape(b, 1, nh * hd), layer.o_weight, layer.o_bias)
            x = F.rms_norm(h, h.shape[-1:], *layer.post_norm)
            gate, up = F.linear(x, layer.gate_up_weight).chunk(2, dim=-1)
            h = h + F.linear(layer.act(gate) * up, layer.down_weight, layer.down_bias)
        h = F.rms_norm(h, h.shape[-1:], *self.final_norm)
        logits: torch.Tensor = self.model.lm_head(h)  # type: ignore[operator]
        return logits[:, -1]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
