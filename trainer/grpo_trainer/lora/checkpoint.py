"""What a LoRA checkpoint holds: the adapters and their optimizer state only."""

from __future__ import annotations

from torch.distributed.checkpoint.state_dict import StateDictOptions

from grpo_api.trainer_config import LoraConfig


def state_dict_options(lora: LoraConfig | None) -> StateDictOptions:
    """Options for ``get_state_dict``/``set_state_dict`` of the actor.

    LoRA: frozen parameters are left out (the base is reloaded from the model path at
    every start), and loading does not ask the base back from the checkpoint; DCP
    itself still fails if an adapter or its optimizer state is missing.
    """
    if lora is None:
        return StateDictOptions()
    return StateDictOptions(ignore_frozen_params=True, strict=False)
