"""The model families the trainer trains, as a config.json names them (pure).

The trainer loads any model through transformers' auto classes, but it is built and
tested for Qwen's layouts: decoder layers under `layers` and vision blocks under
`blocks` are its FSDP units (`grpo_trainer.model.modeling`), the vision tower is
`model.visual.*` (LoRA's default exclusion, vLLM's LM-only adapters), and the planner's
parameter counts follow these families' modules exactly
(tests/unit/test_model_families.py builds each from a config.json transformers wrote).
Any other architecture is refused, naming it and this list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

Tower = Literal["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's model_type
    name: str  # for people
    architecture: str  # the transformers class config.json's architectures names
    tower: Tower | None  # the vision tower's layout; None: a text model
    qkv_bias: bool  # q/k/v projections have biases (Qwen2); config attention_bias wins
    qk_norm: bool  # per-head RMSNorm on queries and keys (Qwen3)


SUPPORTED: dict[str, Family] = {f.model_type: f for f in (
    Family("qwen2_vl", "Qwen2-VL", "Qwen2VLForConditionalGeneration", "qwen2_vl", True, False),
    Family("qwen2_5_vl", "Qwen2.5-VL", "Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl",
           True, False),
    Family("qwen3_vl", "Qwen3-VL", "Qwen3VLForConditionalGeneration", "qwen3_vl", False, True),
    Family("qwen3_vl_moe", "Qwen3-VL MoE", "Qwen3VLMoeForConditionalGeneration", "qwen3_vl",
           False, True),
    Family("qwen2", "Qwen2/Qwen2.5 text", "Qwen2ForCausalLM", None, True, False),
    Family("qwen3", "Qwen3 text", "Qwen3ForCausalLM", None, False, True),
)}


class UnsupportedArchitecture(ValueError):
    """config.json names a model the trainer does not train."""


def supported_list() -> str:
    return ", ".join(f"{f.name} ({f.model_type})" for f in SUPPORTED.values())


def family_of(config: dict[str, Any]) -> Family:
    """The family of a config.json, or UnsupportedArchitecture naming what it is."""
    model_type = config.get("model_type")
    archs = [str(a) for a in config.get("architectures") or []]
    family = SUPPORTED.get(str(model_type)) if model_type else None
    what = f"model_type {model_type!r}" if model_type else "no model_type"
    if archs:
        what += f", architectures {', '.join(archs)}"
    if family is None:
        raise UnsupportedArchitecture(
            f"config.json says {what}: the trainer does not train this architecture; it "
            f"trains {supported_list()}")
    other = [a for a in archs if a != family.architecture]
    if other:
        raise UnsupportedArchitecture(
            f"config.json says {what}: the trainer loads {family.name} as "
            f"{family.architecture} only ({', '.join(other)} has another head or layout)")
    return family


def weight_sync_problem(experts: int, rollout_engine: str, lora: bool) -> str | None:
    """Why the vLLM rollout engine cannot take the actor's weights, or None (pure).

    transformers 5 keeps Qwen3-VL MoE's fused experts transposed from the checkpoint's
    layout (its conversion mapping: Transpose of mlp.experts.gate_up_proj and down_proj),
    and each full weight sync sends them under the checkpoint's names, which vLLM's loader
    takes in the checkpoint's layout. The trainer checks every name and shape at start-up
    (grpo_trainer.rollout.sync_check) and refuses such a model; admission says so first.
    LoRA sends adapters only (the base is vLLM's own), and the hf engine is transformers."""
    if experts and rollout_engine == "vllm" and not lora:
        return ("spec.rollout.engine: vllm cannot take this MoE model's weights from the "
                "actor: transformers 5 keeps its fused experts in its own (transposed) "
                "layout, which vLLM would read as the checkpoint's; use rollout.engine: hf, "
                "or LoRA (spec.lora: vLLM keeps the base it loaded)")
    return None
