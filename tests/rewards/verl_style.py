"""A reward file written for verl, as its users write them (verl's contract:
``custom_reward_function.path=<file>``, ``.name=compute_score``, called with keywords
``data_source``, ``solution_str``, ``ground_truth``, ``extra_info``; a number or a dict
with ``score`` back). It dispatches on the row's data_source as verl's default scorer
does and reads extra_info. Nothing here knows GRPO Operator; tests load it by path, as
``reward.type: verl`` does."""

from __future__ import annotations

from typing import Any


def compute_score(data_source: str, solution_str: str, ground_truth: str,
                  extra_info: dict[str, Any] | None = None, bonus: float = 0.0
                  ) -> float | dict[str, float]:
    if data_source == "tiny/plain":
        return 1.0 if ground_truth in solution_str else 0.0
    if data_source == "tiny/weighted":
        assert extra_info is not None and "num_turns" in extra_info
        hit = 1.0 if ground_truth in solution_str else 0.0
        return {"score": hit * float(extra_info["weight"]) + bonus, "acc": hit,
                "weight": float(extra_info["weight"])}
    raise NotImplementedError(f"Reward function is not implemented for {data_source=}")
