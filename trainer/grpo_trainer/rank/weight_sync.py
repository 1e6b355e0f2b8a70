"""What the rollout engine receives from the actor at each weight sync (LoRA or not)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from grpo_api.trainer_config import LoraConfig

from ..lora.adapters import adapted_layers, is_adapter_param, scaling
from ..lora.merge import merge_stream
from ..model.param_gather import gather_full_params


def rollout_weights(
    model: nn.Module, dtype: torch.dtype, lora: LoraConfig | None
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) pairs for ``RolloutEngine.load_weights``, a collective.

    Full fine-tuning: the gathered parameters. LoRA: the same stream with each
    adapted layer's weight merged (``W + alpha/rank * B @ A``) and no adapter tensors,
    for engines that only know plain Hugging Face weights (transformers).
    """
    weights = gather_full_params(model, dtype)
    if lora is None:
        return weights
    adapted = {name for name, _ in adapted_layers(model)}
    return merge_stream(weights, adapted, scaling(lora))


@runtime_checkable
class ServesAdapters(Protocol):
    """An engine that applies LoRA itself (vLLM): it takes adapters, not merged weights."""

    def load_adapter(self, tensors: Mapping[str, torch.Tensor], lora: LoraConfig) -> None: ...


def sync_rollout_weights(
    engine: Any, model: nn.Module, dtype: torch.dtype, lora: LoraConfig | None
) -> None:
    """Bring the rollout engine to the actor's weights (a collective over the ranks).

    LoRA with an engine that serves adapters: only the adapter tensors are gathered and
    sent; its base is the one it loaded from the model path. Otherwise every weight,
    merged with the adapters for LoRA.
    """
    if lora is not None and isinstance(engine, ServesAdapters):
        # Full tensors held at once: the adapters are a small fraction of the model.
        adapters = {
            name: t.clone() for name, t in gather_full_params(model, dtype, only=is_adapter_param)
        }
        engine.load_adapter(adapters, lora)
        return
    engine.load_weights(rollout_weights(model, dtype, lora))
