"""The planner's only I/O: read a model's config.json when the model is a local directory."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_api.model_config import CONFIG_FILE, ConfigUnavailable, read_dir


def read_model_config(model_path: str, root: Path | None = None) -> dict[str, Any] | None:
    """Parsed config.json under `model_path` (optionally below `root`), or None if absent.

    A hub id such as "Qwen/Qwen2.5-VL-7B-Instruct" is not a local directory and yields
    None, so the planner falls back to the known-family table.
    """
    base = Path(model_path)
    if root is not None and base.is_absolute():
        base = root / base.relative_to("/")
    if not (base / CONFIG_FILE).is_file():
        return None
    try:
        return read_dir(base)
    except ConfigUnavailable as exc:
        raise ValueError(str(exc)) from None
