"""Run a reward function over a batch in parallel; a crash fails one sample, not the run."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import partial
from typing import Any

from grpo_api.trainer_config import RewardConfig

from ..config_error import ConfigError
from .math_answer import math_reward
from .r1v import r1v_reward

log = logging.getLogger(__name__)

RewardFn = Callable[[str, str], Any]


@dataclass(frozen=True)
class RewardResult:
    score: float
    accuracy: float | None
    failed: str | None = None  # the logged reason when the function raised


def resolve_reward_fn(cfg: RewardConfig) -> RewardFn:
    if cfg.type == "math":
        return partial(math_reward, format_weight=cfg.format_weight)
    if cfg.type == "r1v":
        return partial(r1v_reward, format_weight=cfg.format_weight)
    assert cfg.function is not None
    module, _, name = cfg.function.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        raise ConfigError("reward.function", f"cannot import {cfg.function!r}: {err}") from None
    if not callable(fn):
        raise ConfigError("reward.function", f"{cfg.function!r} is not callable")
    return fn


def _to_result(value: Any) -> RewardResult:
    if isinstance(value, dict):
        acc = value.get("accuracy")
        return RewardResult(float(value["overall"]), None if acc is None else float(acc))
    return RewardResult(float(value), None)


class RewardRunner:
    """Threads, not processes: reward functions are short and usually regex-bound;
    a user function that needs real parallelism can release the GIL or fan out
    itself. Timeouts and exceptions turn into a zero reward with the reason logged."""

    def __init__(self, fn: RewardFn, num_workers: int, timeout_s: float) -> None:
        self.fn = fn
        self.timeout_s = timeout_s
        self.pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="reward")

    def _one(self, response: str, truth: str) -> RewardResult:
        try:
            return _to_result(self.fn(response, truth))
        except Exception as err:  # the user function is untrusted code
            return RewardResult(0.0, None, failed=f"{type(err).__name__}: {err}")

    def score(self, responses: Sequence[str], truths: Sequence[str]) -> list[RewardResult]:
        futures = [
            self.pool.submit(self._one, r, t) for r, t in zip(responses, truths, strict=True)
        ]
        out: list[RewardResult] = []
        for i, fut in enumerate(futures):
            try:
                res = fut.result(timeout=self.timeout_s)
            except FutureTimeout:
                res = RewardResult(0.0, None, failed=f"timed out after {self.timeout_s}s")
            if res.failed:
                log.warning("reward for sample %d failed (scored 0): %s", i, res.failed)
            out.append(res)
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
