"""Config dicts for tests and demos on the tiny models."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def text_config(model: Path, data: Path, **sections: dict[str, Any]) -> dict[str, Any]:
    """The learnable text task on 2 CPU ranks; ``sections`` merge into the defaults."""
    cfg: dict[str, Any] = {
        "model": {"path": str(model)},
        "data": {"train_files": [str(data)]},
        "rollout": {"n": 8, "max_new_tokens": 8},
        "actor": {"lr": 1e-2, "micro_batch_size": 8, "dtype": "float32", "weight_decay": 0.0},
        "reward": {
            "type": "function",
            "function": "grpo_trainer.rewards.mentions:mentions_answer",
        },
        "resources": {"num_workers": 2, "ray_address": "local"},
        "trainer": {"total_steps": 2, "rollout_batch_size": 4},
        "metrics": {"progress_bar": "off"},
    }
    for key, value in sections.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return cfg
