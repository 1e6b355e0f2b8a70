"""`grpo-train score-reward`: a reward tried on the first rows of the data before a job,
each row's verdict printed, exit 1 when the reward failed on any."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from click.testing import CliRunner

from grpo_trainer.cli import cli
from grpo_trainer.tiny.data import write_vision_task

pytestmark = pytest.mark.unit

REWARDS = Path(__file__).parents[1] / "rewards"


def _config(tmp_path: Path, reward: dict[str, object], weights: bool) -> Path:
    rows = pq.read_table(write_vision_task(tmp_path / "v.parquet", rows=3)).to_pylist()
    if weights:
        for i, row in enumerate(rows):
            row["weight"] = float(i)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "data.parquet")
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({"model": {"path": "/not/needed"},
                                    "data": {"train_files": [str(tmp_path / "data.parquet")]},
                                    "reward": reward}))
    return path


def test_each_rows_own_answer_is_scored_by_a_reward_reading_the_row(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"type": "function", "function": f"{REWARDS}/row_reader.py:score"},
                  weights=True)
    res = CliRunner().invoke(cli, ["score-reward", "--config", str(cfg), "--rows", "2"])
    assert res.exit_code == 0, res.output
    # weight i, the answer said, one image 40 or 44 px wide
    assert f"{tmp_path}/data.parquet row 0: score 0.04 accuracy 1" in res.output
    assert f"{tmp_path}/data.parquet row 1: score 1.044 accuracy 1" in res.output
    assert "row 2" not in res.output


def test_a_reward_that_fails_on_the_data_exits_1_with_the_reason(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"type": "function", "function": f"{REWARDS}/row_reader.py:score"},
                  weights=False)
    res = CliRunner().invoke(cli, ["score-reward", "--config", str(cfg), "--response", "1"])
    assert res.exit_code == 1
    assert res.output.count("FAILED: KeyError: 'weight'") == 3


def test_a_reward_that_cannot_load_is_a_config_error(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"type": "verl", "function": "/rewards/missing.py:compute_score"},
                  weights=False)
    res = CliRunner().invoke(cli, ["score-reward", "--config", str(cfg)])
    assert res.exit_code == 2
    assert "reward.function: /rewards/missing.py does not exist in the head pod" in res.output


def test_rows_past_the_first_file_are_read_from_the_next_one(tmp_path: Path) -> None:
    """The trial scans the files one at a time: the fourth row is the second file's first,
    scored with its own row (not the first file's row 0)."""
    cfg = _config(tmp_path, {"type": "function", "function": f"{REWARDS}/row_reader.py:score"},
                  weights=True)
    rows = pq.read_table(tmp_path / "data.parquet").to_pylist()
    for row in rows:
        row["weight"] = 10.0
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "more.parquet")
    doc = yaml.safe_load(cfg.read_text())
    doc["data"]["train_files"].append(str(tmp_path / "more.parquet"))
    cfg.write_text(yaml.safe_dump(doc))
    res = CliRunner().invoke(cli, ["score-reward", "--config", str(cfg), "--rows", "4"])
    assert res.exit_code == 0, res.output
    assert f"{tmp_path}/data.parquet row 2: score 2.048 accuracy 1" in res.output
    assert f"{tmp_path}/more.parquet row 0: score 10.04 accuracy 1" in res.output
    assert "more.parquet row 1" not in res.output
