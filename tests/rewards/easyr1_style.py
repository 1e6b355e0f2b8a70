"""A reward file written for EasyR1, as its users write them (EasyR1's contract:
``worker.reward.reward_function=<file>:compute_score``, ``reward_type=batch``): a list of
``{"response", "response_length", "ground_truth"}`` in, a list of ``{"overall", ...}``
out, keyword arguments from ``reward_function_kwargs``. Nothing here knows GRPO Operator;
tests load it by path, as ``reward.type: easyr1`` does."""

from __future__ import annotations

import re
from typing import Any


def format_reward(response: str) -> float:
    return 1.0 if re.fullmatch(r".*<answer>.*</answer>.*", response, re.DOTALL) else 0.0


def accuracy_reward(response: str, ground_truth: str) -> float:
    return 1.0 if ground_truth in response else 0.0


def compute_score(reward_inputs: list[dict[str, Any]], format_weight: float = 0.1
                  ) -> list[dict[str, float]]:
    if not isinstance(reward_inputs, list):
        raise ValueError("Please use `reward_type=batch` for this reward function.")
    scores = []
    for reward_input in reward_inputs:
        if set(reward_input) != {"response", "response_length", "ground_truth"}:
            raise KeyError(f"EasyR1 passes three keys, got {sorted(reward_input)}")
        fmt = format_reward(reward_input["response"])
        acc = accuracy_reward(reward_input["response"], reward_input["ground_truth"])
        scores.append({
            "overall": (1 - format_weight) * acc + format_weight * fmt,
            "format": fmt,
            "accuracy": acc,
            "length": float(reward_input["response_length"]),
        })
    return scores
