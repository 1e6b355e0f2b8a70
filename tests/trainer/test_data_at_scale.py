"""Real VLM data through the index (grpo_trainer.dataset), with the real tiny Qwen2.5-VL
processor: the length pass across processes counts what the driver counts alone, and a
job on text-only, one-image, three-image and video rows trains on 2 ranks (each rank
reading its own rows from the file) and resumes exactly."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from grpo_testkit.datasets import write_mixed_task
from grpo_trainer.algorithm.samples import prompt_token_counter
from grpo_trainer.checkpointing.dcp import DCPCheckpointer
from grpo_trainer.checkpointing.files import atomic_write
from grpo_trainer.checkpointing.tracker import Tracker
from grpo_trainer.config import build_config
from grpo_trainer.dataset import PromptDataset, lengths
from grpo_trainer.dataset import index as index_mod
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.driver.metrics import MetricsLogger
from grpo_trainer.rank.worker import Worker

pytestmark = pytest.mark.trainer

VOLATILE = ("time/", "throughput/", "memory/")


def test_the_pass_across_processes_counts_as_the_driver_does(
    tiny_vlm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_mixed_task(tmp_path / "mixed.parquet", rows=24, images=(1, 0, 3, 0),
                            videos=(0, 0, 0, 1), row_group_size=5)
    cfg = build_config({"model": {"path": str(tiny_vlm)},
                        "data": {"train_files": [str(data)], "length_workers": 2,
                                 "max_videos_per_prompt": 1}}, environ={})
    count = prompt_token_counter(cfg)
    alone = PromptDataset(cfg.data.train_files, cfg.data, prompt_tokens=count)
    monkeypatch.setattr(lengths, "POOL_MIN_ROWS", 1)
    monkeypatch.setattr(index_mod, "CHUNK_ROWS", 7)
    lines: list[str] = []
    pooled = PromptDataset(cfg.data.train_files, cfg.data, prompt_tokens=count, config=cfg,
                           report=lines.append)
    assert pooled.index.tokens.tolist() == alone.index.tokens.tolist()
    assert pooled.index.images.tolist() == [1, 0, 3, 0] * 6
    assert pooled.index.videos.tolist() == [0, 0, 0, 1] * 6
    assert [count(r) for r in alone.records] == alone.index.tokens.tolist()
    assert lines and lines[-1].startswith("data.train_files: prompt lengths: 24/24 rows (")


def _config(model: Path, data: Path, ckpt: Path) -> Any:
    return build_config({
        "model": {"path": str(model)},
        "data": {"train_files": [str(data)], "format_prompt": "math", "shuffle": False,
                 "max_videos_per_prompt": 1},
        "rollout": {"n": 2, "max_new_tokens": 4},
        "algorithm": {"kl_coef": 0.1, "kl_estimator": "low_var_kl"},
        "actor": {"lr": 1e-3, "micro_batch_size": 2, "mini_batch_size": 4},
        "reward": {"type": "math"},
        "resources": {"num_workers": 2, "ray_address": "local"},
        "trainer": {"total_steps": 4, "rollout_batch_size": 2},
        "checkpoint": {"dir": str(ckpt), "interval_steps": 2, "keep": 2},
        "metrics": {"progress_bar": "off"},
    }, environ={})


def _run(cfg: Any) -> tuple[dict[int, dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """(metrics by step without timings, full params before, after)."""
    out = io.StringIO()
    trainer = GRPOTrainer(cfg, checkpointer=DCPCheckpointer(cfg),
                          metrics=MetricsLogger(cfg.metrics, cfg.trainer.total_steps,
                                                stream=out))
    try:
        trainer.start()
        assert trainer.group is not None
        before = trainer.group.call(Worker.full_params)[0]
        trainer.run()
        after = trainer.group.call(Worker.full_params)[0]
    finally:
        trainer.close()
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    return ({m["step"]: {k: v for k, v in m.items() if not k.startswith(VOLATILE)}
             for m in lines}, before, after)


def test_a_job_on_mixed_rows_trains_on_two_ranks_and_resumes_exactly(
    tiny_vlm: Path, tmp_path: Path, ray_local: None
) -> None:
    """Rows of 1 image, none, 3 images and a video (4 frames), in order, one group per rank
    and micro-batch: every step puts rows of different kinds on the two ranks (a text-only
    or video micro-batch beside an image one: tests/trainer/test_mixed_image_text.py). The
    ranks read their rows from the file; a fresh driver given the step-2 checkpoint prints
    the same metrics for steps 3-4."""
    data = write_mixed_task(tmp_path / "mixed.parquet", rows=12, images=(1, 0, 3, 0),
                            videos=(0, 0, 0, 1), row_group_size=4)
    metrics, before, after = _run(_config(tiny_vlm, data, tmp_path / "ckpt"))
    assert sorted(metrics) == [1, 2, 3, 4]
    assert all(m["actor/optimizer_steps"] == 1 for m in metrics.values())
    assert all(m["data/bad_rows"] == 0 for m in metrics.values())
    changed = {k for k in before if not (before[k] == after[k]).all()}
    assert any("visual" in k for k in changed) and any("language_model" in k for k in changed)

    resumed_dir = tmp_path / "resumed"
    resumed_dir.mkdir()
    shutil.copytree(tmp_path / "ckpt" / "step-2", resumed_dir / "step-2")
    atomic_write(resumed_dir / "latest", Tracker(step=2, dir="step-2").model_dump_json().encode())
    resumed, _, _ = _run(_config(tiny_vlm, data, resumed_dir))
    assert sorted(resumed) == [3, 4]
    for step in (3, 4):
        assert resumed[step] == metrics[step], step
