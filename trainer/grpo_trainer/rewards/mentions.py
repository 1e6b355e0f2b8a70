"""A dense reward for short-answer tasks: how often the response says the answer.

Partial credit (capped at 4 mentions) gives a small or freshly initialised model a
gradient long before it answers exactly, which an exact-match reward does not. The tiny
example job (`examples/grpojob-tiny.yaml`) trains on it, and it ships in the trainer
image, so `reward.function: grpo_trainer.rewards.mentions:mentions_answer` works in any
job.
"""

from __future__ import annotations

MAX_MENTIONS = 4


def mentions_answer(response: str, ground_truth: str) -> dict[str, float]:
    """``overall``: mentions of ``ground_truth`` / 4 (capped); ``accuracy``: any mention."""
    hits = response.count(ground_truth)
    return {"overall": min(hits, MAX_MENTIONS) / MAX_MENTIONS, "accuracy": 1.0 if hits else 0.0}
