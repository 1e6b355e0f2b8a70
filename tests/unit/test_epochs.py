"""The trainer's step count from its schedule: maxSteps wins, else epochs x whole batches."""

from __future__ import annotations

import pytest

from grpo_api.trainer_config import TrainerConfig

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("schedule", "prompts", "steps"),
    [
        ({"epochs": 1}, 100, 12),  # 100 // 8: the last 4 prompts do not fill a step
        ({"epochs": 3}, 100, 36),
        ({"epochs": 3, "total_steps": 5}, 100, 5),
        ({}, 7, 1),  # fewer prompts than a batch: the loader refuses it; never 0 steps
    ],
)
def test_steps_follow_epochs_unless_total_steps_is_set(
    schedule: dict[str, int], prompts: int, steps: int
) -> None:
    trainer = TrainerConfig.model_validate({"rollout_batch_size": 8, **schedule})
    assert trainer.steps(prompts) == steps
