"""Math reward: ``\\boxed{}`` answer accuracy plus the think-then-answer format.

Scored as EasyR1 does: ``overall = (1 - w) * accuracy + w * format`` with w = 0.1.
"""

from __future__ import annotations

import re
from fractions import Fraction

_FORMAT = re.compile(r"\s*<think>.*?</think>.*\\boxed\{.*\}.*", re.DOTALL)


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``, with nested braces balanced."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    i = start + len("\\boxed{")
    depth = 1
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def _normalise(ans: str) -> str:
    s = ans.strip().strip("$").strip()
    for junk in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\ ", " ", "^\\circ", "^{\\circ}"):
        s = s.replace(junk, "")
    s = re.sub(r"\\text\{(.*?)\}", r"\1", s)
    s = re.sub(r"\\d?frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", s)
    return s.rstrip(".").lower()


def _as_number(s: str) -> Fraction | None:
    s = s.replace(",", "")
    m = re.fullmatch(r"\(?(-?\d+(?:\.\d+)?)\)?(?:/\(?(-?\d+(?:\.\d+)?)\)?)?", s)
    if not m:
        return None
    try:
        num = Fraction(m.group(1))
        return num / Fraction(m.group(2)) if m.group(2) else num
    except (ValueError, ZeroDivisionError):
        return None


def answers_match(given: str, truth: str) -> bool:
    a, b = _normalise(given), _normalise(truth)
    if a == b:
        return True
    na, nb = _as_number(a), _as_number(b)
    return na is not None and nb is not None and na == nb


def format_score(response: str) -> float:
    return 1.0 if _FORMAT.fullmatch(response) else 0.0


def accuracy_score(response: str, ground_truth: str) -> float:
    boxed = extract_boxed(response)
    truth = extract_boxed(ground_truth) or ground_truth
    return 1.0 if boxed is not None and answers_match(boxed, truth) else 0.0


def math_reward(response: str, ground_truth: str, format_weight: float = 0.1) -> dict[str, float]:
    fmt = format_score(response)
    acc = accuracy_score(response, ground_truth)
    return {
        "overall": (1 - format_weight) * acc + format_weight * fmt,
        "format": fmt,
        "accuracy": acc,
    }
