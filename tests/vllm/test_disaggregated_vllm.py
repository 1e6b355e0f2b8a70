"""Disaggregated rollouts with ``rollout.engine: vllm`` for real (vLLM's CPU backend): a
vLLM engine as a Ray actor on the node labelled grpo.dev/side=rollout, apart from the two
gloo ranks on the =train node (conftest ``labelled_cluster``), one step ahead
(max_staleness 1). The engine gets the full weights over the weight group after every
update (vLLM's in-place reload); its samples carry the policy version they were drawn
with, and its per-token log-probs are the behaviour log-probs the stale samples' importance
weights divide by."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_testkit.staleness import check_one_step_ahead, run
from grpo_trainer.config import build_config

pytestmark = pytest.mark.timeout(900)
STEPS = 3


def test_a_vllm_engine_apart_trains_one_step_ahead(
    vllm_lm: Path, tmp_path: Path, labelled_cluster: Any
) -> None:
    data = write_text_task(tmp_path / "t.jsonl")
    cfg = build_config(text_config(
        vllm_lm, data,
        resources={"num_workers": 2, "ray_address": labelled_cluster.address},
        trainer={"total_steps": STEPS, "rollout_batch_size": 4},
        rollout={"engine": "vllm", "placement": "disaggregated", "max_staleness": 1,
                 "disaggregated": {"nodes": 1, "engines_per_node": 1}},
    ), environ={})
    history = run(cfg)
    assert len(history) == STEPS
    check_one_step_ahead(history, cfg.algorithm.offpolicy_is_cap)
    # Step 1 trains on the policy that drew it: vLLM's log-probs are the trainer's up to
    # kernel differences.
    assert history[0]["rollout/logprob_abs_diff_mean"] < 1e-3
