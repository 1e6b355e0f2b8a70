"""Every kind of reward (``reward.type``) as one shape: a call per response or per step,
what it returns turned into a ``RewardResult``, and whether it reads whole rows.

The forms (docs/rewards.md):
- ``math``, ``r1v``: builtin, of the response and the answer.
- ``function``: yours. Two arguments, ``fn(response, ground_truth)`` (as before); one,
  ``fn(sample)`` with a ``RewardSample`` (the response and the whole row); with
  ``reward.batch``, ``fn(samples)`` once per step, returning one score per sample.
- ``easyr1``: an EasyR1 reward function as EasyR1 calls it, ``fn(reward_input)`` or with
  ``reward.batch`` ``fn(reward_inputs)``, each a dict of ``response``,
  ``response_length`` and ``ground_truth``; returns ``{"overall": ..., ...}``.
- ``verl``: a verl ``compute_score(data_source, solution_str, ground_truth, extra_info)``
  called with keywords as verl calls it; returns a number or ``{"score": ..., ...}``.
- ``http``: a judge endpoint (judge.py).
``reward.kwargs`` are passed to the function as keywords.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from grpo_api.trainer_config import RewardConfig

from ..config_error import ConfigError
from .math_answer import math_reward
from .r1v import r1v_reward
from .sample import RewardSample


@dataclass(frozen=True)
class RewardResult:
    score: float
    accuracy: float | None
    failed: str | None = None  # the reason when the call raised or returned no score
    # Other numbers the reward returned (EasyR1's format, overlong, ...): logged as
    # reward/<name>.
    extras: Mapping[str, float] = field(default_factory=dict)


def extra_means(results: Sequence[RewardResult], prefix: str) -> dict[str, float]:
    """The mean of each extra number over the responses that reported it, as
    ``<prefix><name>`` (EasyR1 and verl log theirs so)."""
    sums: dict[str, list[float]] = {}
    for r in results:
        for k, v in r.extras.items():
            sums.setdefault(k, []).append(v)
    return {f"{prefix}{k}": sum(v) / len(v) for k, v in sums.items()}


class NoScore(ValueError):
    """A reward returned something that is not a score."""


@dataclass(frozen=True)
class Reward:
    """A resolved reward: exactly one of ``one`` (called per response) and ``many``
    (called once with a step's responses, returning one value per response)."""

    name: str  # how logs name it
    to_result: Callable[[Any], RewardResult]
    reads_rows: bool  # it is given the whole row, not only the answer column
    one: Callable[[RewardSample], Any] | None = None
    many: Callable[[list[RewardSample]], Sequence[Any]] | None = None


def to_result(value: Any, score_key: str = "overall") -> RewardResult:
    """A number, or a dict with ``score_key`` (and optionally ``accuracy`` or verl's
    ``acc``, and other numbers), as a result. A NaN or infinite score would poison the
    group's advantages: it is no score."""
    if isinstance(value, Mapping):
        if score_key not in value:
            raise NoScore(f"returned a dict without {score_key!r} (keys: "
                          f"{', '.join(map(str, value)) or 'none'})")
        score = _number(value[score_key], score_key)
        acc_key = "accuracy" if "accuracy" in value else "acc" if "acc" in value else None
        accuracy = None if acc_key is None else _number(value[acc_key], acc_key)
        extras = {str(k): float(v) for k, v in value.items()
                  if k not in (score_key, acc_key) and _is_number(v)}
        return RewardResult(score, accuracy, extras=extras)
    return RewardResult(_number(value, "the score"), None)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and math.isfinite(float(v))


def _number(v: Any, what: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise NoScore(f"returned {type(v).__name__} as {what}, not a number")
    if not math.isfinite(float(v)):
        raise NoScore(f"returned {v} as {what}")
    return float(v)


def load_function(spec: str) -> Callable[..., Any]:
    """``module:callable`` imported, or ``/path/file.py:callable`` loaded from the file
    (as EasyR1 and verl load theirs)."""
    where, _, name = spec.rpartition(":")
    try:
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise ConfigError("reward.function", f"{path} does not exist in the head pod: "
                                  "mount it there (a ConfigMap in spec.pods.head.volumes and "
                                  "volumeMounts), or bake it into an image FROM the trainer's")
            module_name = f"grpo_reward_{path.stem}"
            loader_spec = importlib.util.spec_from_file_location(module_name, path)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[module_name] = module  # dataclasses and pickling look it up
            loader_spec.loader.exec_module(module)
        else:
            module = importlib.import_module(where)
        fn = getattr(module, name)
    except ConfigError:
        raise
    except Exception as err:  # the user's module may raise anything at import
        raise ConfigError("reward.function",
                          f"cannot load {spec!r}: {type(err).__name__}: {err}") from None
    if not callable(fn):
        raise ConfigError("reward.function", f"{spec!r} is not callable")
    return fn


def required_positionals(fn: Callable[..., Any]) -> int | None:
    """How many positional arguments ``fn`` needs (None: it cannot be inspected)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.kind in kinds and p.default is inspect.Parameter.empty)


def _easyr1_input(s: RewardSample) -> dict[str, Any]:
    return {"response": s.response, "response_length": s.response_length,
            "ground_truth": s.ground_truth}


def _verl_call(fn: Callable[..., Any], kwargs: Mapping[str, Any], s: RewardSample) -> Any:
    """As verl's reward manager calls it: the row's data_source, its extra_info (a copy,
    with the single-turn keys verl adds)."""
    extra = dict(s.row.get("extra_info") or {})
    extra.setdefault("num_turns", None)
    extra.setdefault("rollout_reward_scores", {})
    return fn(data_source=s.row.get("data_source"), solution_str=s.response,
              ground_truth=s.ground_truth, extra_info=extra, **kwargs)


def _function(cfg: RewardConfig, fn: Callable[..., Any], kw: Mapping[str, Any]) -> Reward:
    needs = required_positionals(fn)
    name = f"reward function {cfg.function}"
    if cfg.batch:
        if needs not in (None, 1):
            raise ConfigError("reward.batch", f"{cfg.function} takes {needs} arguments; a "
                              "batch function takes one, the list of samples")
        return Reward(name, to_result, True, many=lambda ss: fn(ss, **kw))
    if needs == 2:  # fn(response, ground_truth): the answer column is all it reads
        return Reward(name, to_result, False,
                      one=lambda s: fn(s.response, s.ground_truth, **kw))
    if needs not in (None, 1):
        raise ConfigError("reward.function", f"{cfg.function} takes {needs} arguments: "
                          "write fn(sample) (the response and its row), fn(response, "
                          "ground_truth), or with reward.batch fn(samples)")
    return Reward(name, to_result, True, one=lambda s: fn(s, **kw))


def resolve_reward(cfg: RewardConfig, judge: Callable[[RewardSample], Any] | None = None
                   ) -> Reward:
    """The job's reward; ``judge`` is the HTTP judge for type http (built by the caller,
    which reads its token from the environment)."""
    if cfg.type == "math":
        return Reward("math reward", to_result, False,
                      one=lambda s: math_reward(s.response, s.ground_truth, cfg.format_weight))
    if cfg.type == "r1v":
        return Reward("r1v reward", to_result, False,
                      one=lambda s: r1v_reward(s.response, s.ground_truth, cfg.format_weight))
    if cfg.type == "http":
        assert judge is not None and cfg.http is not None
        return Reward(f"judge {cfg.http.url}", to_result, True, one=judge)
    assert cfg.function is not None
    fn = load_function(cfg.function)
    kw = dict(cfg.kwargs)
    if cfg.type == "easyr1":
        name = f"EasyR1 reward {cfg.function}"
        if cfg.batch:
            return Reward(name, to_result, False,
                          many=lambda ss: fn([_easyr1_input(s) for s in ss], **kw))
        return Reward(name, to_result, False, one=lambda s: fn(_easyr1_input(s), **kw))
    if cfg.type == "verl":
        return Reward(f"verl compute_score {cfg.function}", partial(to_result, score_key="score"),
                      True, one=partial(_verl_call, fn, kw))
    return _function(cfg, fn, kw)
