"""Exporting a LoRA checkpoint: the base from the model path with the adapters merged
in (the adapters alone, as a PEFT directory, are ``peft_format.write_adapter_dir``)."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from grpo_api.trainer_config import LoraConfig, ModelConfig

from ..lora.adapters import is_adapter_param, scaling
from ..lora.merge import merge_state


class NotAnAdapterCheckpoint(ValueError):
    """The checkpoint's model tensors are not (only) LoRA adapters."""


def merged_model_tensors(
    mcfg: ModelConfig, lora: LoraConfig, adapters: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """Hugging Face weights: the base read from ``mcfg.path``, each adapted layer's
    weight replaced by ``W + alpha/rank * B @ A`` (summed in float32)."""
    from ..model.modeling import load_full

    others = [k for k in adapters if not is_adapter_param(k)]
    if others or not adapters:
        raise NotAnAdapterCheckpoint(
            f"a LoRA checkpoint holds adapter tensors only; found {others[:3] or 'none'}"
        )
    base = load_full(mcfg, torch.float32).state_dict()
    return merge_state({**base, **adapters}, scaling(lora))

