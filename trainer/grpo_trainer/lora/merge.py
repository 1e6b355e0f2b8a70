"""Folding adapters into base weights: ``W + (alpha / rank) * B @ A``. Pure tensor maths.

Used where a consumer has no notion of adapters: the transformers rollout engine (fed
merged weights at each sync) and the merged export.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping

import torch

from .adapters import ADAPTER_A, ADAPTER_B, is_adapter_param


def merged_weight(
    weight: torch.Tensor, a: torch.Tensor, b: torch.Tensor, scale: float
) -> torch.Tensor:
    """``weight + scale * b @ a`` in ``weight``'s dtype, summed in float32."""
    delta = b.float() @ a.float()
    return (weight.float() + scale * delta).to(weight.dtype)


def _layer_of(name: str) -> str:
    """``x.q_proj.lora_A.weight`` -> ``x.q_proj``."""
    return name.rsplit(".", 2)[0]


def merge_state(tensors: Mapping[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A model state (base + adapter tensors) as plain Hugging Face weights: each
    adapted layer's ``weight`` merged, the adapter tensors gone."""
    out = {k: v for k, v in tensors.items() if not is_adapter_param(k)}
    for name in tensors:
        if name.endswith(f".{ADAPTER_A}.weight"):
            layer = _layer_of(name)
            weight_name = f"{layer}.weight"
            if weight_name not in out:
                raise KeyError(f"adapter {name} has no base weight {weight_name}")
            b = tensors[f"{layer}.{ADAPTER_B}.weight"]
            out[weight_name] = merged_weight(out[weight_name], tensors[name], b, scale)
    return out


def merge_stream(
    weights: Iterable[tuple[str, torch.Tensor]], adapted: Collection[str], scale: float
) -> Iterator[tuple[str, torch.Tensor]]:
    """``merge_state`` over a (name, tensor) stream in ``named_parameters`` order, for
    the layers named in ``adapted``.

    An adapted layer's ``weight`` comes before its ``lora_A`` and ``lora_B``: it is
    held (copied: the stream's tensors may be views of a reused gather buffer) until
    both arrived, so at most one layer's tensors are held at a time.
    """
    held: dict[str, torch.Tensor] = {}
    for name, tensor in weights:
        if not is_adapter_param(name):
            if name.endswith(".weight") and name.removesuffix(".weight") in adapted:
                held[name] = tensor.clone()
            else:
                yield name, tensor
            continue
        held[name] = tensor.clone()
        layer = _layer_of(name)
        w, a, b = f"{layer}.weight", f"{layer}.{ADAPTER_A}.weight", f"{layer}.{ADAPTER_B}.weight"
        if w in held and a in held and b in held:
            yield w, merged_weight(held.pop(w), held.pop(a), held.pop(b), scale)
    if held:
        raise KeyError(f"adapted layers without base weight or adapter pair: {sorted(held)}")
