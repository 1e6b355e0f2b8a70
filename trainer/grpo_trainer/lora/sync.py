"""What the rollout engine receives from a LoRA actor at each weight sync."""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import nn

from grpo_api.trainer_config import LoraConfig

from ..param_gather import gather_full_params
from .adapters import adapted_layers, scaling
from .merge import merge_stream


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
