"""The planner's only I/O: read a model's config.json when the model is a local directory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_model_config(model_path: str, root: Path | None = None) -> dict[str, Any] | None:
    """Parsed config.json under `model_path` (optionally below `root`), or None if absent.

    A hub id such as "Qwen/Qwen2.5-VL-7B-Instruct" is not a local directory and yields
    None, so the planner falls back to the known-family table.
    """
    base = Path(model_path)
    if root is not None and base.is_absolute():
        base = root / base.relative_to("/")
    candidate = base / "config.json"
    if not candidate.is_file():
        return None
    try:
        data = json.loads(candidate.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{candidate}: cannot read config.json: {exc}") from None
    return data if isinstance(data, dict) else None
