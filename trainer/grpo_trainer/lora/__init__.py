"""LoRA fine-tuning (``actor.lora``): adapters on the language model's linear layers,
the frozen base, merging, and PEFT's on-disk format (docs/trainer.md "LoRA")."""

from .adapters import (
    NoTargets,
    adapted_layers,
    adapters_disabled,
    attach_adapters,
    is_adapter_param,
    reset_adapters,
    scaling,
    target_names,
)
from .merge import merge_state, merge_stream, merged_weight

__all__ = [
    "NoTargets",
    "adapted_layers",
    "adapters_disabled",
    "attach_adapters",
    "is_adapter_param",
    "merge_state",
    "merge_stream",
    "merged_weight",
    "reset_adapters",
    "scaling",
    "target_names",
]
