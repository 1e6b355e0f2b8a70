"""R1-V style reward: ``<think>...</think><answer>...</answer>`` tags, answer compared."""

from __future__ import annotations

import re

from .math_answer import answers_match

_FORMAT = re.compile(r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*", re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def r1v_reward(response: str, ground_truth: str, format_weight: float = 0.1) -> dict[str, float]:
    fmt = 1.0 if _FORMAT.fullmatch(response) else 0.0
    found = _ANSWER.findall(response)
    truth = _ANSWER.findall(ground_truth)
    acc = 1.0 if found and answers_match(found[-1], truth[-1] if truth else ground_truth) else 0.0
    return {
        "overall": (1 - format_weight) * acc + format_weight * fmt,
        "format": fmt,
        "accuracy": acc,
    }
