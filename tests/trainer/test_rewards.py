"""Rewards as researchers bring them, run by the real trainer on real Ray: an EasyR1 batch
reward file and a verl ``compute_score`` file, unchanged (tests/rewards/, loaded by path
as a ConfigMap mounted on the head would be), and our own form reading the whole row (a
column other than the answer, and the image) of a VLM job's parquet data."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from grpo_testkit.configs import text_config
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.driver.metrics import MetricsLogger
from grpo_trainer.tiny.data import write_vision_task

pytestmark = pytest.mark.trainer

REWARDS = Path(__file__).resolve().parents[1] / "rewards"


def _run(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Each step's metrics as the trainer logs them."""
    cfg = build_config(raw, environ={})
    out = io.StringIO()
    trainer = GRPOTrainer(cfg, metrics=MetricsLogger(cfg.metrics, cfg.trainer.total_steps,
                                                     stream=out))
    try:
        trainer.run()
    finally:
        trainer.close()
    return [json.loads(x) for x in out.getvalue().splitlines()]


def _text_rows(path: Path, rows: int, **columns: Any) -> Path:
    with open(path, "w") as f:
        for i in range(rows):
            f.write(json.dumps({"problem": f"Say the number 7 please {i}", "answer": "7",
                                **columns}) + "\n")
    return path


def test_an_easyr1_batch_reward_file_runs_unchanged(
        tiny_lm: Path, tmp_path: Path, ray_local: None) -> None:
    data = _text_rows(tmp_path / "t.jsonl", 4)
    raw = text_config(tiny_lm, data, reward={
        "type": "easyr1", "function": f"{REWARDS}/easyr1_style.py:compute_score",
        "batch": True, "kwargs": {"format_weight": 0.3}})
    raw["trainer"] = {"total_steps": 1, "rollout_batch_size": 4}
    (m,) = _run(raw)
    assert m["reward/failed"] == 0
    # Its extra numbers are logged as EasyR1 logs them; "length" is the response's length
    # in tokens, so its mean is the trainer's own response length.
    assert m["reward/length"] == pytest.approx(m["response/length_mean"])
    assert 0.0 <= m["reward/format"] <= 1.0
    assert m["reward/mean"] == pytest.approx(0.7 * m["reward/accuracy"] + 0.3 * m["reward/format"])


def test_a_verl_compute_score_file_runs_unchanged(
        tiny_lm: Path, tmp_path: Path, ray_local: None) -> None:
    data = _text_rows(tmp_path / "t.jsonl", 4, data_source="tiny/weighted",
                      extra_info={"weight": 3, "split": "train"})
    raw = text_config(tiny_lm, data, reward={
        "type": "verl", "function": f"{REWARDS}/verl_style.py:compute_score",
        "kwargs": {"bonus": 0.5}})
    raw["trainer"] = {"total_steps": 1, "rollout_batch_size": 4}
    (m,) = _run(raw)
    assert m["reward/failed"] == 0
    assert m["reward/weight"] == 3.0  # extra_info reached it, and its dict was logged
    assert m["reward/mean"] == pytest.approx(3 * m["reward/accuracy"] + 0.5)


def test_a_reward_reads_a_column_and_the_image_of_each_row(
        tiny_vlm: Path, tmp_path: Path, ray_local: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = pq.read_table(write_vision_task(tmp_path / "v.parquet", rows=4)).to_pylist()
    for i, row in enumerate(src):
        row["weight"] = float(i + 1)
    data = tmp_path / "weighted.parquet"
    pq.write_table(pa.Table.from_pylist(src), data)
    seen = tmp_path / "seen.jsonl"
    monkeypatch.setenv("ROW_READER_LOG", str(seen))
    raw = text_config(tiny_vlm, data, reward={
        "type": "function", "function": f"{REWARDS}/row_reader.py:score"})
    raw["rollout"] = {"n": 2, "max_new_tokens": 4}
    raw["actor"] = {**raw["actor"], "micro_batch_size": 2}
    raw["trainer"] = {"total_steps": 1, "rollout_batch_size": 4}
    (m,) = _run(raw)
    assert m["reward/failed"] == 0
    calls = [json.loads(x) for x in seen.read_text().splitlines()]
    assert len(calls) == 8  # 4 prompts x 2 responses
    from PIL import Image
    for call in calls:
        row = src[call["index"]]
        assert call["prompt"] == row["problem"] and call["ground_truth"] == row["answer"]
        assert call["weight"] == row["weight"]
        width = Image.open(io.BytesIO(row["images"][0]["bytes"])).size[0]
        assert call["widths"] == [width]  # the row's own image, as stored (not resized)
