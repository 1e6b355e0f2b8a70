"""The e2e vLLM job's reward, shipped in a ConfigMap on the head pod's PYTHONPATH
(docs/rewards.md): the demo's learnable reward (how often the response says the answer),
plus what it read of the row, a column other than the answer (the prompt's image marker)
and the image itself, as extra numbers the step's metrics carry."""

from __future__ import annotations

from typing import Any

from grpo_trainer.rewards.mentions import mentions_answer


def score(sample: Any) -> dict[str, float]:
    widths = [image.size[0] for image in sample.images]
    return {**mentions_answer(sample.response, sample.ground_truth),
            "image_width": float(sum(widths) / len(widths)) if widths else 0.0,
            "image_marker": 1.0 if "<image>" in sample.prompt else 0.0}
