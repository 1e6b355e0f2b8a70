"""Run a reward over a step's responses in parallel; a crash, a timeout or a value that
is no score fails those samples (scored 0, counted in reward/failed), never the run."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from grpo_api.trainer_config import RewardConfig

from .forms import NoScore, Reward, RewardResult, resolve_reward
from .judge import deadline_s, judge_from_env
from .sample import RewardSample

log = logging.getLogger(__name__)
# Distinct failure reasons a step's log names (each with its count).
LOGGED_REASONS = 5


def _failed(reason: str) -> RewardResult:
    return RewardResult(0.0, None, failed=reason)


class RewardRunner:
    """Threads, not processes: reward functions are short and usually regex-bound or wait
    on a judge; a user function that needs real parallelism can release the GIL or fan out
    itself. ``timeout_s`` bounds each call (a batch function's one call per step)."""

    def __init__(self, reward: Reward, num_workers: int, timeout_s: float) -> None:
        self.reward = reward
        self.timeout_s = timeout_s
        self.pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="reward")

    @property
    def reads_rows(self) -> bool:
        return self.reward.reads_rows

    def _convert(self, value: object) -> RewardResult:
        try:
            return self.reward.to_result(value)
        except NoScore as err:
            return _failed(str(err))

    def _call_one(self, sample: RewardSample) -> RewardResult:
        assert self.reward.one is not None
        try:
            value = self.reward.one(sample)
        except Exception as err:  # the user function is untrusted code
            return _failed(f"{type(err).__name__}: {err}")
        return self._convert(value)

    def _wait(self, fut: Future[RewardResult]) -> RewardResult:
        try:
            return fut.result(timeout=self.timeout_s)
        except FutureTimeout:
            return _failed(f"timed out after {self.timeout_s:g}s")

    def _call_many(self, samples: list[RewardSample]) -> list[RewardResult]:
        many = self.reward.many
        assert many is not None
        fut = self.pool.submit(many, samples)
        try:
            values = list(fut.result(timeout=self.timeout_s))
        except FutureTimeout:
            return [_failed(f"the batch call timed out after {self.timeout_s:g}s")] * len(samples)
        except Exception as err:  # the user function is untrusted code
            return [_failed(f"{type(err).__name__}: {err}")] * len(samples)
        if len(values) != len(samples):
            return [_failed(f"returned {len(values)} scores for {len(samples)} responses")
                    ] * len(samples)
        return [self._convert(v) for v in values]

    def score(self, samples: Sequence[RewardSample]) -> list[RewardResult]:
        if self.reward.many is not None:
            out = self._call_many(list(samples))
        else:
            futures = [self.pool.submit(self._call_one, s) for s in samples]
            out = [self._wait(f) for f in futures]
        reasons = Counter(r.failed for r in out if r.failed)
        for reason, n in reasons.most_common(LOGGED_REASONS):
            log.warning("%s failed for %d of %d responses (scored 0): %s",
                        self.reward.name, n, len(out), reason)
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def reward_runner(cfg: RewardConfig) -> RewardRunner:
    """The job's reward and its runner: a judge's threads are its concurrency and its
    timeout every try of a request; a function's are reward.num_workers and timeout_s."""
    if cfg.type == "http":
        assert cfg.http is not None
        return RewardRunner(resolve_reward(cfg, judge_from_env(cfg.http)),
                            cfg.http.concurrency, deadline_s(cfg.http))
    return RewardRunner(resolve_reward(cfg), cfg.num_workers, cfg.timeout_s)
