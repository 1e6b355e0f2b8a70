"""LoRA adapters attached to a model's linear layers, in place.

Each adapted ``nn.Linear`` keeps its own ``weight`` (and ``bias``) and gains two child
layers, ``lora_A`` (in -> rank) and ``lora_B`` (rank -> out), plus a forward hook that
adds ``lora_B(lora_A(x)) * alpha / rank`` to its output. The base parameters keep
their Hugging Face names, so every loader (rank 0 broadcast, sharded reads) and every
weight sync works on them unchanged, and an adapter's tensors are named exactly as
PEFT names them on disk (``...q_proj.lora_A.weight``), less PEFT's
``base_model.model.`` prefix (``peft_format.py``).

Initialisation follows PEFT: ``lora_A`` Kaiming-uniform, ``lora_B`` zero, so the
adapted model starts equal to the base. The base is frozen and stored in the compute
dtype (bf16 on GPUs: half the bytes of fp32 master weights, and nothing to update);
the adapters stay float32, so each FSDP unit's trainable parameters share one dtype
(FSDP2 requires it) and the optimizer updates fp32 masters.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from grpo_api.trainer_config import LoraConfig

from ..config_error import ConfigError

ADAPTER_A = "lora_A"
ADAPTER_B = "lora_B"
_OFF = "_lora_off"  # set on adapted layers while the adapters are disabled
_SCALING = "lora_scaling"


def scaling(lora: LoraConfig) -> float:
    """PEFT's scale of the update: ``lora_alpha / r``."""
    return lora.alpha / lora.rank


def is_adapter_param(name: str) -> bool:
    """Whether a parameter name belongs to an adapter (``...lora_A.weight``)."""
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] in (ADAPTER_A, ADAPTER_B)


def _output_layer_names(model: nn.Module) -> set[str]:
    """The LM head (and any other output projection): never adapted under "all-linear",
    as in PEFT, where the vocabulary-sized head would dwarf every other adapter."""
    get = getattr(model, "get_output_embeddings", None)
    head = get() if callable(get) else None
    return {name for name, m in model.named_modules() if head is not None and m is head}


def target_names(model: nn.Module, lora: LoraConfig) -> list[str]:
    """Module names of the linear layers ``lora`` adapts, in module order.

    ``target_modules`` "all-linear": every ``nn.Linear`` but the output head; a list:
    layers whose name equals an entry or ends with ``.entry`` (PEFT's suffix match;
    the head only if named, which vLLM's LoRA does not serve).
    ``exclude_modules`` is a regex matched against the whole name (PEFT's fullmatch),
    by default the vision tower.
    """
    excluded = re.compile(lora.exclude_modules) if lora.exclude_modules else None
    heads = _output_layer_names(model) if lora.target_modules == "all-linear" else set()
    names = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or name in heads:
            continue
        if excluded is not None and excluded.fullmatch(name):
            continue
        if lora.target_modules != "all-linear" and not any(
            name == t or name.endswith("." + t) for t in lora.target_modules
        ):
            continue
        names.append(name)
    return names


class NoTargets(ConfigError):
    """``actor.lora`` selects no linear layer of the model (exit 2, a config error)."""


def _add_update(module: nn.Module, args: tuple[Any, ...], output: torch.Tensor) -> torch.Tensor:
    """Forward hook of an adapted layer: base output plus the scaled low-rank update."""
    if getattr(module, _OFF, False):
        return output
    a: nn.Linear = getattr(module, ADAPTER_A)
    b: nn.Linear = getattr(module, ADAPTER_B)
    x = args[0]
    # FSDP casts the adapters to the compute dtype; outside FSDP (tests, export
    # checks) they are float32 next to a bf16 base, so meet in the adapter's dtype.
    update = b(a(x.to(a.weight.dtype))) * getattr(module, _SCALING)
    return output + update.to(output.dtype)


def attach_adapters(model: nn.Module, lora: LoraConfig, base_dtype: torch.dtype) -> list[str]:
    """Freeze ``model`` in ``base_dtype`` and give its target layers fp32 adapters.

    Works on real and meta parameters alike (meta ranks get their values from rank 0,
    or from ``reset_adapters`` after a sharded read). Call before ``fully_shard``.
    Returns the adapted layer names; raises ``NoTargets`` if there are none.
    """
    names = target_names(model, lora)
    if not names:
        raise NoTargets(
            "actor.lora.target_modules",
            f"{lora.target_modules!r} (excluding "
            f"{lora.exclude_modules!r}) matches no linear layer of "
            f"{type(model).__name__}: name layers it has, e.g. q_proj, v_proj",
        )
    for p in model.parameters():
        p.requires_grad_(False)
        if p.is_floating_point() and p.dtype != base_dtype:
            p.data = p.data.to(base_dtype)
    modules = dict(model.named_modules())
    for name in names:
        layer = modules[name]
        assert isinstance(layer, nn.Linear)
        device = layer.weight.device
        a = nn.Linear(layer.in_features, lora.rank, bias=False, device=device)
        b = nn.Linear(lora.rank, layer.out_features, bias=False, device=device)
        layer.add_module(ADAPTER_A, a)
        layer.add_module(ADAPTER_B, b)
        setattr(layer, _SCALING, scaling(lora))
        layer.register_forward_hook(_add_update)
    _init(model)
    return names


def adapted_layers(model: nn.Module) -> Iterator[tuple[str, nn.Module]]:
    for name, module in model.named_modules():
        if hasattr(module, _SCALING):
            yield name, module


def _init(model: nn.Module) -> None:
    """PEFT's initialisation (no-op on meta tensors)."""
    with torch.no_grad():
        for _, layer in adapted_layers(model):
            nn.init.kaiming_uniform_(getattr(layer, ADAPTER_A).weight, a=math.sqrt(5))
            nn.init.zeros_(getattr(layer, ADAPTER_B).weight)


def reset_adapters(model: nn.Module, seed: int) -> None:
    """Initialise sharded adapters identically on every rank, without a collective.

    For the ``sharded`` loader, where every rank starts from the meta device: each
    rank draws the full ``lora_A`` from a generator seeded by ``seed`` and keeps its
    own rows of it.
    """
    from torch.distributed.tensor import DTensor, distribute_tensor

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, layer in adapted_layers(model):
            for key in (ADAPTER_A, ADAPTER_B):
                param = getattr(layer, key).weight
                full = torch.zeros(param.shape, dtype=param.dtype)
                if key == ADAPTER_A:
                    bound = 1.0 / math.sqrt(full.shape[1])  # kaiming_uniform_(a=sqrt(5))
                    full.uniform_(-bound, bound, generator=gen)
                if isinstance(param, DTensor):
                    local = distribute_tensor(
                        full, param.device_mesh, param.placements, src_data_rank=None
                    ).to_local()
                    param.to_local().copy_(local)
                else:
                    param.copy_(full)


@contextmanager
def adapters_disabled(model: nn.Module) -> Iterator[None]:
    """The base model: every adapter off (the reference policy, at no extra copy).
    A no-op for a model without adapters."""
    layers = [layer for _, layer in adapted_layers(model)]
    for layer in layers:
        setattr(layer, _OFF, True)
    try:
        yield
    finally:
        for layer in layers:
            setattr(layer, _OFF, False)
