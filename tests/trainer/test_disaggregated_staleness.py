"""Disaggregated rollouts running ahead (max_staleness 1) and an engine whose process
dies, on a real Ray cluster with labelled nodes (conftest ``labelled_cluster``), 2 gloo
ranks and 2 hf engines.

At staleness 1 the engines draw step 2's batch with policy 0 while the ranks train step
1: from step 2 on every sample lags one version, the loss carries the truncated
importance weights, and every metric stays finite. Engines SIGKILLed (their real
processes), one while it generates, one before a weight push, are started again without
ending the run: they join the weight group formed again and get the current weights, the
lost share of the batch is generated again, and rollout/engine_restarts counts them.
"""

from __future__ import annotations

import math
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from grpo_api.trainer_config import Config
from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_testkit.ray_nodes import kill_node
from grpo_testkit.rewards import KILL_PID_FILE
from grpo_testkit.staleness import check_one_step_ahead, run
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer

pytestmark = pytest.mark.trainer
STEPS = 3


def _config(model: Path, data: Path, address: str, k: int, steps: int = STEPS) -> Config:
    return build_config(text_config(
        model, data,
        resources={"num_workers": 2, "ray_address": address},
        trainer={"total_steps": steps, "rollout_batch_size": 4},
        rollout={"placement": "disaggregated", "max_staleness": k,
                 "disaggregated": {"nodes": 1, "engines_per_node": 2}},
    ), environ={})


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text_task(tmp_path_factory.mktemp("staleness") / "t.jsonl")


def test_staleness_1_trains_on_batches_one_version_behind(
    tiny_lm: Path, data: Path, labelled_cluster: Any
) -> None:
    cfg = _config(tiny_lm, data, labelled_cluster.address, 1)
    history = run(cfg)
    assert len(history) == STEPS
    check_one_step_ahead(history, cfg.algorithm.offpolicy_is_cap)


def test_killed_engines_are_started_again_and_the_run_goes_on(
    tiny_lm: Path, data: Path, labelled_cluster: Any, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Engine 1 dies while it generates step 2's batch (its share is generated again);
    engine 0 dies after it delivered its share, while the driver scores step 2's rewards
    (found dead before the weight push, which would otherwise broadcast to it)."""
    import ray

    kill_file = tmp_path / "pid"
    monkeypatch.setenv(KILL_PID_FILE, str(kill_file))
    cfg = _config(tiny_lm, data, labelled_cluster.address, 0, steps=2)
    cfg.reward.function = "grpo_testkit.rewards:reward_killing_a_process"
    trainer = GRPOTrainer(cfg)
    try:
        trainer.start()
        assert trainer.pipeline is not None
        engines = trainer.pipeline.engines
        victims = [i["pid"] for i in engines.info]
        first = trainer.train_step()  # step 1; step 2's batch is being generated
        os.kill(victims[1], signal.SIGKILL)  # engine 1's real process
        kill_file.write_text(str(victims[0]))  # engine 0's, at step 2's rewards
        history = [first, *trainer.run()]
        held = ray.get([e.info.remote() for e in engines.engines])
    finally:
        trainer.close()
    assert len(history) == 2
    assert [m["rollout/engine_restarts"] for m in history] == [0, 2]
    assert not kill_file.exists()  # claimed: engine 0 was killed at step 2's rewards
    assert held[0]["pid"] != victims[0] and held[1]["pid"] != victims[1]
    # Every engine, the new one too, holds the last policy.
    assert [h["version"] for h in held] == [2, 2]
    for m in history:
        assert all(math.isfinite(v) for v in m.values()), m


def test_a_lost_rollout_node_is_replaced_and_the_run_goes_on(
    tiny_lm: Path, data: Path, labelled_cluster: Any
) -> None:
    """The rollout node dies whole (its raylet and engines killed, as a pod deleted at
    once) once the next batch is drawn; a new rollout node joins. An engine started again
    before Ray has declared the old node dead is placed there and dies before it runs: it
    is started again until it lands on the new node, the batches in flight are drawn
    again, and the run goes on. (These text samples come back inline to the driver and
    outlive the node; the e2e tier's vision samples, in the node's object store, do not:
    tests/e2e/test_tiny_job_apart.py.) Last in the module: the cluster keeps the new node."""
    import ray

    from grpo_api.contract import RAY_SIDE_LABEL

    cfg = _config(tiny_lm, data, labelled_cluster.address, 1, steps=3)
    trainer = GRPOTrainer(cfg)
    cluster = labelled_cluster.cluster
    try:
        trainer.start()
        assert trainer.pipeline is not None
        first = trainer.train_step()
        pending = trainer.pipeline.inflight[0]  # drawn by the engines, not yet trained
        refs = [samples for _, samples in pending.refs]
        ray.wait(refs, num_returns=len(refs), fetch_local=False)  # drawn; not fetched here
        node = next(n for n in cluster.worker_nodes
                    if n.node_id == labelled_cluster.nodes["rollout"])
        kill_node(cluster, node)
        cluster.add_node(num_cpus=2, labels={RAY_SIDE_LABEL: "rollout"})
        history = [first, *trainer.run()]
    finally:
        trainer.close()
    assert len(history) == 3
    assert sum(m["rollout/engine_restarts"] for m in history) == 2  # both engines there
    for m in history:
        assert all(math.isfinite(v) for v in m.values()), m
