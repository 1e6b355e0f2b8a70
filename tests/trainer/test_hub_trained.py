"""After the download everything is real: a tiny Qwen2.5-VL and a geometry3k-layout dataset
fetched from a STAND-IN hub (grpo_testkit.hub, the hub's file API on loopback)
onto a volume directory, then trained on by the real trainer from those local files."""

from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest

from grpo_testkit.datasets import write_vision_task
from grpo_testkit.hub import stand_in_hub
from grpo_trainer.config import build_config, check_runtime
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.hub_fetch import main as fetch_main

pytestmark = pytest.mark.trainer


def test_trains_on_what_the_head_fetched(tiny_vlm: Path, tmp_path: Path,
                                         ray_local: None) -> None:
    hub = tmp_path / "hub"
    shutil.copytree(tiny_vlm, hub / "models" / "acme" / "tiny-qwen25vl")
    data = hub / "datasets" / "acme" / "geometry3k-tiny" / "data"
    data.mkdir(parents=True)
    write_vision_task(data / "train-00000-of-00001.parquet", rows=8)
    volume = tmp_path / "volume"
    with stand_in_hub(hub) as server:
        os.environ["HF_ENDPOINT"] = server.url
        try:
            assert fetch_main(["--root", str(volume), "--model", "acme/tiny-qwen25vl",
                               "--dataset", "acme/geometry3k-tiny"]) == 0
        finally:
            del os.environ["HF_ENDPOINT"]
    shutil.rmtree(hub)  # from here on only the volume exists
    cfg = build_config(
        {
            # The paths the operator renders for hub ids (render/hub.py).
            "model": {"path": str(volume / "models" / "acme" / "tiny-qwen25vl")},
            "data": {"train_files": [f"{volume}/datasets/acme/geometry3k-tiny@train"],
                     "format_prompt": "math"},
            "rollout": {"n": 4, "max_new_tokens": 6},
            "actor": {"lr": 1e-3, "micro_batch_size": 2, "mini_batch_size": 4,
                      "dtype": "float32"},
            "reward": {"type": "math"},
            "resources": {"num_workers": 2, "ray_address": "local"},
            "trainer": {"total_steps": 2, "rollout_batch_size": 2},
            "metrics": {"progress_bar": "off"},
        },
        environ={},
    )
    check_runtime(cfg)
    trainer = GRPOTrainer(cfg)
    try:
        history = trainer.run()
    finally:
        trainer.close()
    assert len(history) == 2 and len(trainer.loader.dataset) == 8
    assert all(math.isfinite(m["actor/pg_loss"]) for m in history if "actor/pg_loss" in m)
