"""One decode step of a Llama-family text model without the Hugging Face module stack.

On a CPU the per-token forward of a small model is dominated by framework overhead:
module calls, mask and cache bookkeeping, many small kernels. This step does the same
arithmetic with fewer, larger operations: q/k/v and gate/up each as one matmul over
weights laid out contiguously, attention straight on the engine's KV buffers, and the
model's own norm, activation and rotary modules (so their variants stay theirs). The
projection parameters become views into the fused weights, so the engine's per-step
weight refresh writes straight into them.

Only for model types whose decoder layer is exactly norm -> attention -> residual ->
norm -> gated MLP -> residual with full attention; the engine also checks the first
step against the Hugging Face forward and falls back to it on any mismatch.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import nn

SUPPORTED_MODEL_TYPES = frozenset({"qwen2", "qwen3", "llama", "mistral"})


class KVLayer(Protocol):
    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


@dataclass
class _Layer:
    input_norm: Any
    post_norm: Any
    q_norm: Any | None
    k_norm: Any | None
    qkv_weight: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_proj: nn.Linear
    gate_up_weight: torch.Tensor
    down_proj: nn.Linear
    act: Any


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


def supports(model: nn.Module) -> bool:
    cfg = getattr(model, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return False
    if getattr(cfg, "use_sliding_window", False) or any(
        t != "full_attention" for t in getattr(cfg, "layer_types", None) or []
    ):
        return False
    inner = getattr(model, "model", None)
    if not all(hasattr(inner, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    for layer in inner.layers:  # type: ignore[union-attr]
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
        inner: Any = model.model
        self.inner = inner
        first = inner.layers[0].self_attn
        self.rotate = sys.modules[type(first).__module__].apply_rotary_pos_emb
        self.head_dim = int(first.head_dim)
        self.scaling = float(first.scaling)
        cfg: Any = model.config
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(getattr(cfg, "num_key_value_heads", None) or self.n_heads)
        self.layers: list[_Layer] = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv_weight, qkv_bias = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
            gate_up, _ = _fuse([mlp.gate_proj, mlp.up_proj])
            self.layers.append(
                _Layer(
                    input_norm=layer.input_layernorm.forward,
                    post_norm=layer.post_attention_layernorm.forward,
                    q_norm=attn.q_norm.forward if hasattr(attn, "q_norm") else None,
                    k_norm=attn.k_norm.forward if hasattr(attn, "k_norm") else None,
                    qkv_weight=qkv_weight,
                    qkv_bias=qkv_bias,
                    o_proj=attn.o_proj,
                    gate_up_weight=gate_up,
                    down_proj=mlp.down_proj,
                    act=mlp.act_fn,
                )
            )

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
        nq, nkv = self.n_heads * hd, self.n_kv * hd
        h = self.inner.embed_tokens(tokens[:, None])  # [B, 1, H]
        cos, sin = self.inner.rotary_emb(h, position_ids)
        for layer, kv in zip(self.layers, cache, strict=True):
            qkv = F.linear(layer.input_norm(h), layer.qkv_weight, layer.qkv_bias)
            q = qkv[..., :nq].view(b, 1, self.n_heads, hd)
            k = qkv[..., nq : nq + nkv].view(b, 1, self.n_kv, hd)
            v = qkv[..., nq + nkv :].view(b, 1, self.n_kv, hd).transpose(1, 2)
            if layer.q_norm is not None:
                q = layer.q_norm(q)
            if layer.k_norm is not None:
                k = layer.k_norm(k)
            q, k = self.rotate(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
            keys, values = kv.update(k, v)
            # One query per row: grouped heads as the query axis, one mask for all.
            out = F.scaled_dot_product_attention(
                q.reshape(b, self.n_kv, self.n_heads // self.n_kv, hd),
                keys,
                values,
                attn_mask=attend,
                scale=self.scaling,
            )
            h = h + layer.o_proj(out.reshape(b, 1, nq))
            gate, up = F.linear(layer.post_norm(h), layer.gate_up_weight).chunk(2, dim=-1)
            h = h + layer.down_proj(layer.act(gate) * up)
        logits: torch.Tensor = self.model.lm_head(self.inner.norm(h))  # type: ignore[operator]
        return logits[:, -1]
