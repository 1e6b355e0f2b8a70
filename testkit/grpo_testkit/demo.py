"""Write a runnable local demo: a tiny model, a dataset and a trainer config.

    python -m grpo_testkit.demo DIR [--vision] [--steps N]
    grpo-train --config DIR/config.yaml

The text task's reward is learnable in a few dozen steps on a CPU; ``--vision``
uses the tiny Qwen2.5-VL with an image per prompt and the math reward.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from .configs import text_config


def write_demo(out: Path, *, vision: bool = False, steps: int = 20) -> Path:
    from . import datasets, tiny_models

    out.mkdir(parents=True, exist_ok=True)
    cfg: dict[str, Any]
    if vision:
        model = tiny_models.build_tiny_qwen2_5_vl(out / "model")
        data = datasets.write_vision_task(out / "train.parquet")
        cfg = text_config(model, data, rollout={"n": 4})
        cfg["reward"] = {"type": "math"}
        cfg["data"]["format_prompt"] = "math"
    else:
        model = tiny_models.build_tiny_qwen2(out / "model")
        data = datasets.write_text_task(out / "train.jsonl")
        cfg = text_config(model, data)
    cfg["trainer"]["total_steps"] = steps
    cfg["metrics"] = {"progress_bar": "auto", "tensorboard_dir": str(out / "tensorboard")}
    cfg["checkpoint"] = {"dir": str(out / "checkpoints")}
    path = out / "config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--vision", action="store_true")
    p.add_argument("--steps", type=int, default=20)
    args = p.parse_args()
    path = write_demo(args.dir, vision=args.vision, steps=args.steps)
    print(f"grpo-train --config {path}")


if __name__ == "__main__":
    main()
