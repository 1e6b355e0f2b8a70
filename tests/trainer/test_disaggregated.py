"""Disaggregated rollouts at staleness 0 on a real Ray cluster with labelled nodes
(``ray.cluster_utils.Cluster``: a head without labels, a node labelled
grpo.dev/side=train, one labelled =rollout), 2 gloo ranks and 2 hf engines.

One cluster serves the module, in order: a colocated run is the reference; the
disaggregated run places its ranks on the train node and its engines on the rollout
node, and with max_staleness 0 (each engine drawing rank e's prompts with rank e's
seeds, the weights broadcast after every update) prints the reference's metrics, its
validation passes (greedy, on the engines) included, and ends with its weights, bit for
bit; resumed from its step-1 checkpoint (step 2's batch, in flight at the save, dropped
and generated again) it continues exactly as it ran.
"""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_api.trainer_config import Config
from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_trainer.checkpointing.dcp import DCPCheckpointer
from grpo_trainer.checkpointing.export import load_model_tensors
from grpo_trainer.checkpointing.files import atomic_write
from grpo_trainer.checkpointing.tracker import Tracker
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.driver.metrics import MetricsLogger
from grpo_trainer.rank.worker import Worker

pytestmark = pytest.mark.trainer
STEPS = 2
# Timings and memory differ run to run; the pipeline's own metrics exist only apart.
VOLATILE = ("time/", "throughput/", "memory/", "offpolicy/", "rollout/engine_restarts",
            "rollout/batches_in_flight")


@dataclass
class Labelled:
    address: str
    model: Path
    data: Path
    val: Path
    tmp: Path
    nodes: dict[str, str]  # side -> Ray node id
    state: dict[str, Any] = field(default_factory=dict)

    def config(self, ckpt: Path | None, **rollout: Any) -> Config:
        saves = {"dir": str(ckpt), "interval_steps": 1, "keep": STEPS} if ckpt else {}
        raw = text_config(
            self.model, self.data,
            resources={"num_workers": 2, "ray_address": self.address},
            # Validation (greedy, on the engines apart) before the first step and after each.
            trainer={"total_steps": STEPS, "rollout_batch_size": 4, "val_interval_steps": 1},
            checkpoint=saves,
            rollout=rollout,
        )
        raw["data"]["val_files"] = [str(self.val)]
        return build_config(raw, environ={})


def disaggregated(k: int) -> dict[str, Any]:
    return {"placement": "disaggregated", "max_staleness": k,
            "disaggregated": {"nodes": 1, "engines_per_node": 2}}


@pytest.fixture(scope="module")
def labelled(tiny_lm: Path, tmp_path_factory: pytest.TempPathFactory,
             labelled_cluster: Any) -> Labelled:
    tmp = tmp_path_factory.mktemp("disaggregated")
    return Labelled(labelled_cluster.address, tiny_lm, write_text_task(tmp / "t.jsonl"),
                    write_text_task(tmp / "v.jsonl", rows=4), tmp, labelled_cluster.nodes)


def run(cfg: Config, before: Any = None) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """The JSON metric lines by step, volatile ones left out, and the final weights."""
    out = io.StringIO()
    trainer = GRPOTrainer(cfg, checkpointer=DCPCheckpointer(cfg) if cfg.checkpoint.dir else None,
                          metrics=MetricsLogger(cfg.metrics, STEPS, stream=out))
    try:
        trainer.start()
        if before is not None:
            before(trainer)
        trainer.run()
        assert trainer.group is not None
        weights = trainer.group.call(Worker.full_params)[0]
    finally:
        trainer.close()
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    return {m["step"]: {k: v for k, v in m.items() if not k.startswith(VOLATILE)}
            for m in lines}, weights


def test_colocated_reference(labelled: Labelled) -> None:
    metrics, weights = run(labelled.config(None))
    assert sorted(metrics) == [0, 1, 2]  # 0: the validation baseline
    assert all("val/reward_mean" in metrics[s] for s in (0, 1, 2))
    labelled.state["reference"] = (metrics, weights)


def test_staleness_0_apart_is_the_colocated_run_bit_for_bit(labelled: Labelled) -> None:
    placed: dict[str, Any] = {}

    def where(trainer: GRPOTrainer) -> None:
        assert trainer.group is not None and trainer.pipeline is not None
        placed["ranks"] = {i["node_id"] for i in trainer.group.info}
        placed["engines"] = {i["node_id"] for i in trainer.pipeline.engines.info}

    ckpt = labelled.tmp / "apart"
    metrics, weights = run(labelled.config(ckpt, **disaggregated(0)), where)
    # Each side on the nodes labelled for it, never on the head (labelled neither).
    assert placed == {"ranks": {labelled.nodes["train"]},
                      "engines": {labelled.nodes["rollout"]}}
    ref_metrics, ref_weights = labelled.state["reference"]
    assert metrics == ref_metrics
    assert weights.keys() == ref_weights.keys()
    for name, tensor in weights.items():
        assert torch.equal(tensor, ref_weights[name]), name
    labelled.state["apart"] = (ckpt, metrics)


def test_staleness_0_resumed_from_a_checkpoint_continues_exactly(
    labelled: Labelled, tmp_path: Path
) -> None:
    ref, ref_metrics = labelled.state["apart"]
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copytree(ref / "step-1", ckpt / "step-1")
    atomic_write(ckpt / "latest", Tracker(step=1, dir="step-1").model_dump_json().encode())
    metrics, _ = run(labelled.config(ckpt, **disaggregated(0)))
    assert sorted(metrics) == [2]  # from step 2, not again from 1
    assert metrics[2] == ref_metrics[2]
    final, want = load_model_tensors(ckpt / f"step-{STEPS}"), load_model_tensors(
        ref / f"step-{STEPS}")
    assert final.keys() == want.keys()
    for name, tensor in final.items():
        assert torch.equal(tensor, want[name]), name
