"""An engine lost in the middle of a weight push (rollout/engine_group.py,
rollout/weight_bus.py), on a real Ray cluster with labelled nodes (conftest
``labelled_cluster``), 2 gloo ranks and 2 hf engines: the last engine's process exits
after the first tensor of policy 1's push (fault ``engine_exit_mid_push``). The push
gives up, the engine is started again, every member joins a new weight group, policy 1
is pushed again and the run goes on; its replacement holds the last policy."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer

pytestmark = pytest.mark.trainer


def test_an_engine_lost_mid_push_is_replaced_and_the_run_goes_on(
    tiny_lm: Path, labelled_cluster: Any, tmp_path: Path
) -> None:
    import ray

    data = write_text_task(tmp_path / "t.jsonl")
    cfg = build_config(text_config(
        tiny_lm, data,
        resources={"num_workers": 2, "ray_address": labelled_cluster.address},
        trainer={"total_steps": 2, "rollout_batch_size": 4,
                 "fault_inject": "engine_exit_mid_push@step=1"},
        rollout={"placement": "disaggregated", "max_staleness": 0,
                 "disaggregated": {"nodes": 1, "engines_per_node": 2}},
    ), environ={})
    trainer = GRPOTrainer(cfg)
    try:
        trainer.start()
        assert trainer.pipeline is not None
        engines = trainer.pipeline.engines
        before = [i["pid"] for i in engines.info]
        history = trainer.run()
        held = ray.get([e.info.remote() for e in engines.engines])
    finally:
        trainer.close()
    assert len(history) == 2
    # Policy 1's push (after step 1's update) lost the last engine: replaced once.
    assert [m["rollout/engine_restarts"] for m in history] == [1, 0]
    assert held[0]["pid"] == before[0] and held[1]["pid"] != before[1]
    assert [h["version"] for h in held] == [2, 2]  # the replacement too
    for m in history:
        assert all(math.isfinite(v) for v in m.values()), m
