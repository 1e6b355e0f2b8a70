"""config.json files written by transformers itself, one per family the trainer trains
(and one it does not), tiny: what a checkpoint's directory holds for the planner.

`write_config(dir, family)` saves the config as `save_pretrained` of that family's model
class would (its `architectures` set to the class), without building any weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_TEXT: dict[str, Any] = {
    "vocab_size": 448, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
    "tie_word_embeddings": False,
}  # fmt: skip
_QWEN3_TEXT = {**_TEXT, "head_dim": 16}
_VISION_QWEN3 = {
    "depth": 3, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2,
    "out_hidden_size": 64, "num_position_embeddings": 64, "deepstack_visual_indexes": [0, 1],
}  # fmt: skip

# family -> (config class, model class, config arguments), all in transformers.
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration", {
        "text_config": _TEXT, "vision_config": {
            "depth": 2, "embed_dim": 32, "hidden_size": 64, "mlp_ratio": 4, "num_heads": 2}}),
    "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", {
        "text_config": _TEXT, "vision_config": {
            "depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2,
            "out_hidden_size": 64, "fullatt_block_indexes": [1]}}),
    "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration", {
        "text_config": _QWEN3_TEXT, "vision_config": _VISION_QWEN3}),
    "qwen3_vl_moe": ("Qwen3VLMoeConfig", "Qwen3VLMoeForConditionalGeneration", {
        "text_config": {**_QWEN3_TEXT, "moe_intermediate_size": 32, "num_experts": 4,
                        "num_experts_per_tok": 2},
        "vision_config": _VISION_QWEN3}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", _TEXT),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", _QWEN3_TEXT),
    # Not a family the trainer trains: the operator refuses it, naming it.
    "llama": ("LlamaConfig", "LlamaForCausalLM", _TEXT),
}
SUPPORTED_FAMILIES = tuple(f for f in FAMILIES if f != "llama")


def tiny_config(family: str) -> Any:
    """The transformers config object of a tiny model of `family`."""
    import transformers

    config_cls, model_cls, kwargs = FAMILIES[family]
    config = getattr(transformers, config_cls)(**kwargs)
    config.architectures = [model_cls]  # as the model's save_pretrained records it
    return config


def write_config(path: str | Path, family: str) -> Path:
    """`path`/config.json of a tiny `family` model, written by transformers."""
    path = Path(path)
    tiny_config(family).save_pretrained(path)
    return path / "config.json"


def write_qwen25_vl_3b(path: str | Path) -> Path:
    """`path`/config.json with Qwen2.5-VL-3B's published dimensions, as transformers
    writes it (for a job under a name no table knows: planned on real GPU types)."""
    from transformers import Qwen2_5_VLConfig

    text = {"vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 11008,
            "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
            "tie_word_embeddings": True}
    vision = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
              "out_hidden_size": 2048, "fullatt_block_indexes": [7, 15, 23, 31]}
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True)
    config.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    path = Path(path)
    config.save_pretrained(path)
    return path / "config.json"
