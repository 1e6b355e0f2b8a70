"""spec.logging's experiment trackers with the real libraries: a short run writes its
step metrics to a wandb offline run (WANDB_MODE=offline writes it locally) and to an MLflow
file-store run; a restarted attempt resumes both runs from its checkpoint's step; a tracker
that cannot start is dropped and training goes on. And the first example's model:
`grpo-train make-tiny` builds what examples/grpojob-first.yaml plans for."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from grpo_api.trainer_config import Config
from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_trainer.checkpointing.dcp import DCPCheckpointer
from grpo_trainer.cli import cli
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.driver.tracking import RUN_KEY_TAG

pytestmark = pytest.mark.trainer

REPO = Path(__file__).resolve().parents[2]
RUN_ID = "3f2a-job-uid"  # what the operator renders: the job's uid, the same every attempt


def wandb_history(run_file: Path) -> dict[int, dict[str, Any]]:
    """The history rows of a wandb transaction log (run-<id>.wandb), by step: records in
    LevelDB's log format (32 KiB blocks, 7-byte headers) after wandb's 7-byte file header,
    each a wandb_internal_pb2.Record (wandb ships no reader of its own)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, block = run_file.read_bytes(), 32768
    assert data[:4] == b":W&B", data[:7]
    pos, payloads, partial = 7, [], b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding to the block's end
            pos += left
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        partial = chunk if kind in (1, 2) else partial + chunk  # FULL/FIRST, MIDDLE/LAST
        if kind in (1, 4):
            payloads.append(partial)
    rows: dict[int, dict[str, Any]] = {}
    for raw in payloads:
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                     for i in rec.history.item}
            rows[rec.history.step.num] = items
    return rows


def config(model: Path, data: Path, tmp: Path, steps: int, **metrics: Any) -> Config:
    raw = text_config(model, data, metrics={
        "wandb": {"project": "grpo-test", "run_id": RUN_ID, "run_name": "first",
                  "dir": str(tmp)},
        "mlflow": {"tracking_uri": (tmp / "mlruns").as_uri(), "experiment": "team/first",
                   "run_key": RUN_ID, "run_name": "first"},
        **metrics,
    }, checkpoint={"dir": str(tmp / "ckpt"), "interval_steps": 2})
    raw["trainer"]["total_steps"] = steps
    return build_config(raw, environ={})


def train(cfg: Config) -> list[dict[str, float]]:
    trainer = GRPOTrainer(cfg, checkpointer=DCPCheckpointer(cfg))
    try:
        return trainer.run()
    finally:
        trainer.close()


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # the run is written locally, for wandb sync
    # MLflow 3.17 keeps its file store only behind this switch (it advises a database).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")


def mlflow_runs(tmp: Path) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("team/first")
    assert experiment is not None
    return list(client.search_runs([experiment.experiment_id]))


def test_two_attempts_log_their_steps_to_one_wandb_run_and_one_mlflow_run(
        tiny_lm: Path, tmp_path: Path, ray_local: None, offline: None) -> None:
    from mlflow.tracking import MlflowClient

    data = write_text_task(tmp_path / "text.jsonl", rows=8)
    first = train(config(tiny_lm, data, tmp_path, steps=2))
    second = train(config(tiny_lm, data, tmp_path, steps=3))  # resumes from step 2's save
    assert len(first) == 2 and len(second) == 1

    runs = sorted((tmp_path / "wandb").glob(f"offline-run-*-{RUN_ID}/run-{RUN_ID}.wandb"))
    assert len(runs) == 2, runs  # one per attempt, both of the job's run id
    history = [wandb_history(r) for r in runs]
    assert sorted(history[0]) == [1, 2] and sorted(history[1]) == [3]
    for rows, logged in ((history[0], first), (history[1], second)):
        for step, metrics in zip(sorted(rows), logged, strict=True):
            assert rows[step]["reward/mean"] == pytest.approx(metrics["reward/mean"])

    (run,) = mlflow_runs(tmp_path)  # the second attempt found the first's run by its key
    assert run.data.tags[RUN_KEY_TAG] == RUN_ID and run.info.run_name == "first"
    assert run.info.status == "FINISHED"
    assert run.data.params["trainer.total_steps"] == "2"  # the first attempt's config
    points = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri()).get_metric_history(
        run.info.run_id, "reward/mean")
    assert [p.step for p in points] == [1, 2, 3]
    assert [p.value for p in points] == pytest.approx(
        [m["reward/mean"] for m in (*first, *second)])


def test_a_tracker_that_cannot_start_is_dropped_and_training_goes_on(
        tiny_lm: Path, tmp_path: Path, ray_local: None, offline: None,
        caplog: pytest.LogCaptureFixture) -> None:
    data = write_text_task(tmp_path / "text.jsonl", rows=8)
    cfg = config(tiny_lm, data, tmp_path, steps=1,
                 mlflow={"tracking_uri": "nosuch://tracker", "experiment": "x"})
    with caplog.at_level("WARNING", logger="grpo_trainer.driver.tracking"):
        assert len(train(cfg)) == 1
    assert "metrics.mlflow: not logging to mlflow" in caplog.text, caplog.text
    (run,) = (tmp_path / "wandb").glob(f"offline-run-*-{RUN_ID}/run-{RUN_ID}.wandb")
    assert sorted(wandb_history(run)) == [1]  # the other tracker still logged


def test_make_tiny_builds_the_model_the_first_example_plans_for(tmp_path: Path) -> None:
    """examples/grpojob-first.yaml gives the planner make-tiny's model shape (the model is
    built by the attempt's init container, after the job is planned, so there is no
    config.json to read then): they must agree, and a second run keeps the build."""
    from safetensors import safe_open

    out = tmp_path / "tiny"
    first = CliRunner().invoke(cli, ["make-tiny", "--out", str(out)])
    assert first.exit_code == 0 and first.stdout.startswith("built "), first.output
    shape = yaml.safe_load((REPO / "examples/grpojob-first.yaml").read_text())[
        "spec"]["model"]["shape"]
    with safe_open(str(out / "model" / "model.safetensors"), "pt") as f:
        sizes = {k: f.get_slice(k).get_shape() for k in f.keys()}  # noqa: SIM118
    count = {k: math.prod(s) for k, s in sizes.items()}
    assert sum(count.values()) == shape["parameters"]
    assert sum(v for k, v in count.items() if "visual" in k) == shape["visionParameters"]
    text = json.loads((out / "model" / "config.json").read_text())["text_config"]
    assert {"layers": text["num_hidden_layers"], "hiddenSize": text["hidden_size"],
            "intermediateSize": text["intermediate_size"],
            "attentionHeads": text["num_attention_heads"],
            "kvHeads": text["num_key_value_heads"], "vocabSize": text["vocab_size"]} == \
        {k: v for k, v in shape.items() if k not in ("parameters", "visionParameters")}
    import pyarrow.parquet as pq

    assert pq.read_table(out / "train.parquet").num_rows == 32
    again = CliRunner().invoke(cli, ["make-tiny", "--out", str(out)])
    assert again.exit_code == 0 and again.stdout.startswith("kept "), again.output
