"""What a disaggregated run one step ahead (rollout.max_staleness 1) must show, for the
trainer and vLLM tiers' tests: step 1 trains the batch its own policy drew, every later
step a batch one version behind, weighted by truncated importance weights."""

from __future__ import annotations

import math

from grpo_api.trainer_config import Config
from grpo_trainer.driver.driver import GRPOTrainer


def run(cfg: Config) -> list[dict[str, float]]:
    trainer = GRPOTrainer(cfg)
    try:
        return trainer.run()
    finally:
        trainer.close()


def check_one_step_ahead(history: list[dict[str, float]], cap: float) -> None:
    gaps = [(m["offpolicy/version_gap_mean"], m["offpolicy/version_gap_max"]) for m in history]
    # Step 1's batch was drawn by policy 0, which it trains; each later step trains a
    # batch its predecessor's policy drew.
    assert gaps == [(0.0, 0.0)] + [(1.0, 1.0)] * (len(history) - 1), gaps
    assert history[0]["offpolicy/is_weight_mean"] == 1.0
    for m in history[1:]:
        # Stale tokens weigh pi_proximal / pi_behaviour, truncated at the cap.
        assert 0.0 < m["offpolicy/is_weight_min"] <= m["offpolicy/is_weight_mean"]
        assert m["offpolicy/is_weight_max"] <= cap
        assert m["offpolicy/is_weight_mean"] != 1.0
        assert m["rollout/batches_in_flight"] <= 1.0
    for m in history:
        assert all(math.isfinite(v) for v in m.values()), m
