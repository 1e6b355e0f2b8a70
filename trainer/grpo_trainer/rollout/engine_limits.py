"""What a rollout engine cannot run, known from the model's ``config.json`` alone.

Checked with the config, before Ray starts or a weight is loaded: otherwise the run
loads everything and fails at step 1 inside the engine's kernels.

vLLM's CPU attention (vLLM 0.32, ``CPUAttentionBackend.get_supported_head_sizes``)
has kernels for these head sizes only; any other (16, 48, ...) fails at the first
forward with "Unsupported CPU attention configuration: head_dim=...". The list is
copied because importing vLLM to read it costs tens of seconds; the vllm test tier
checks it against the installed vLLM.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from grpo_api.model.config_json import head_dim, text_fields

VLLM_CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

# vLLM's ``max_lora_rank`` must be one of these (vLLM 0.32, ``vllm.config.lora.MaxLoRARanks``).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``max_lora_rank`` vLLM accepts that holds an adapter of ``rank``."""
    fits = [r for r in VLLM_LORA_RANKS if r >= rank]
    if not fits:
        raise ValueError(
            f"actor.lora.rank {rank} exceeds vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}: "
            "use a smaller rank or rollout.engine: hf"
        )
    return fits[0]


def vllm_cpu_problem(model_config: Mapping[str, Any]) -> str | None:
    """Why vLLM's CPU backend cannot run this model (with the fix), or None."""
    dim = head_dim(model_config)
    if dim is None or dim in VLLM_CPU_HEAD_SIZES:
        return None
    text = text_fields(model_config)
    heads = text.get("num_attention_heads")
    origin = "head_dim" if text.get("head_dim") else f"{text['hidden_size']} / {heads} heads"
    sizes = ", ".join(str(s) for s in VLLM_CPU_HEAD_SIZES)
    return (
        f"'vllm' on CPU cannot run this model: its head_dim is {dim} ({origin}), and vLLM's "
        f"CPU attention supports head_dim {sizes} only. Use rollout.engine: hf, or a model "
        "whose head_dim is one of those (at least 32)"
    )
