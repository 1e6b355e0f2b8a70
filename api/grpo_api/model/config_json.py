"""A model's config.json as both sides read it: the language model's fields and its
head size. A VLM nests its language model under ``text_config`` (transformers 5 writes
every Qwen VL that way); a text model keeps them at the top level."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def text_fields(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's settings: ``text_config`` over the top level."""
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, Mapping) else dict(config)


def head_dim(config: Mapping[str, Any]) -> int | None:
    """``head_dim`` where config.json gives it (Qwen3's differs from the width's share),
    else ``hidden_size / num_attention_heads``; None when neither is known."""
    text = text_fields(config)
    if text.get("head_dim"):
        return int(text["head_dim"])
    hidden, heads = text.get("hidden_size"), text.get("num_attention_heads")
    if not hidden or not heads:
        return None
    return int(hidden) // int(heads)
