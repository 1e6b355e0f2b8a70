"""PEFT's on-disk adapter format: ``adapter_config.json`` + ``adapter_model.safetensors``.

What PEFT's ``save_pretrained`` writes for a LoRA adapter, so that PEFT
(``PeftModel.from_pretrained``) and vLLM (``LoRARequest``) load our adapters: tensors
named ``base_model.model.<module>.lora_A.weight`` / ``lora_B.weight`` (``lora_A``:
[rank, in], ``lora_B``: [out, rank]), and a config naming rank, alpha and targets.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from grpo_api.trainer_config import LoraConfig

from .adapters import is_adapter_param

PEFT_PREFIX = "base_model.model."
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"


def peft_tensors(adapters: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our adapter tensors (model-relative names) under PEFT's keys."""
    return {PEFT_PREFIX + k: v for k, v in adapters.items() if is_adapter_param(k)}


def adapter_config(
    lora: LoraConfig, adapters: Mapping[str, torch.Tensor], base: str
) -> dict[str, Any]:
    """PEFT's ``LoraConfig`` as JSON, targets spelled as the layer-name suffixes adapted
    (PEFT's own rendering of "all-linear"), with the exclusion kept."""
    suffixes = sorted({k.split(".")[-3] for k in adapters if is_adapter_param(k)})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": lora.rank,
        "lora_alpha": lora.alpha,
        "target_modules": suffixes,
        "exclude_modules": lora.exclude_modules,
        "lora_dropout": 0.0,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
        "layers_to_transform": None,
        "layers_pattern": None,
        "rank_pattern": {},
        "alpha_pattern": {},
    }


def write_adapter_dir(
    out: Path,
    lora: LoraConfig,
    adapters: Mapping[str, torch.Tensor],
    base: str,
    dtype: torch.dtype | None = None,
) -> Path:
    """Write a PEFT adapter directory; returns it."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {
        k: (v.to(dtype) if dtype is not None else v).contiguous()
        for k, v in peft_tensors(adapters).items()
    }
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt"})
    (out / CONFIG_FILE).write_text(json.dumps(adapter_config(lora, adapters, base), indent=2))
    return out
