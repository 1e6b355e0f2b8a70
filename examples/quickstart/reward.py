"""The walkthrough's reward (docs/quickstart-cluster.md): a function of the whole row.

It scores how often the response says the answer, as the first job's reward does, and
reads two things besides the answer, as a reward of your own would: the row's `problem`
column (here: whether the prompt asks about an image) and the image itself (its width).
Each extra number is logged as `reward/<name>` beside the reward.
"""

from __future__ import annotations

from typing import Any


def score(sample: Any) -> dict[str, float]:
    said = 1.0 if sample.ground_truth and sample.ground_truth in sample.response else 0.0
    widths = [image.size[0] for image in sample.images]
    return {
        "overall": said,
        "accuracy": said,
        "asks_about_image": 1.0 if "<image>" in str(sample.row["problem"]) else 0.0,
        "image_width": float(sum(widths) / len(widths)) if widths else 0.0,
    }
