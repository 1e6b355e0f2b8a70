"""spec.reward as the operator takes it: each reward kind renders the trainer's reward
section, which the trainer's schema accepts; a judge's token stays an env var's name; a
setting that does not fit the type is refused naming the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.job import SpecError, parse_spec
from grpo_api.trainer_config import Config
from grpo_operator.reconcile import planned
from grpo_operator.render import JobRef
from grpo_operator.render.trainer_config import trainer_config

TINY = Path(__file__).resolve().parents[2] / "examples/grpojob-tiny.yaml"


def _spec(reward: dict[str, Any]) -> dict[str, Any]:
    doc = next(d for d in yaml.safe_load_all(TINY.read_text()) if d and d["kind"] == "GRPOJob")
    return {**doc["spec"], "reward": reward}


def _rendered(reward: dict[str, Any]) -> dict[str, Any]:
    spec = parse_spec(_spec(reward))
    cfg = trainer_config(spec, planned(spec), JobRef("j", "ns", "u"))
    Config.model_validate(cfg)  # what the trainer will load
    return dict(cfg["reward"])


@pytest.mark.parametrize(("reward", "section"), [
    ({"type": "easyr1", "function": "/rewards/math.py:compute_score", "batch": True,
      "kwargs": {"format_weight": 0.2}},
     {"type": "easyr1", "function": "/rewards/math.py:compute_score", "batch": True,
      "kwargs": {"format_weight": 0.2}, "format_weight": 0.1}),
    ({"type": "verl", "function": "my_rewards.gsm8k:compute_score"},
     {"type": "verl", "function": "my_rewards.gsm8k:compute_score", "format_weight": 0.1}),
    ({"type": "http", "http": {"url": "http://judge.ml.svc:8000/score", "retries": 4,
                               "tokenEnv": "JUDGE_TOKEN"}},
     {"type": "http", "format_weight": 0.1, "http": {
         "url": "http://judge.ml.svc:8000/score", "timeout_s": 30.0, "retries": 4,
         "concurrency": 8, "send_images": False, "token_env": "JUDGE_TOKEN"}}),
])
def test_each_reward_kind_renders_a_section_the_trainer_accepts(
        reward: dict[str, Any], section: dict[str, Any]) -> None:
    assert _rendered(reward) == section


@pytest.mark.parametrize(("reward", "words"), [
    ({"type": "easyr1"}, "function: required when type is easyr1"),
    ({"type": "http"}, "http: required when type is http"),
    ({"type": "math", "batch": True}, "batch: only for type function or easyr1"),
    ({"type": "http", "http": {"url": "ftp://judge"}}, "reward.http.url"),
    ({"type": "function", "function": "rewards/mine.py:score"}, "reward.function"),
])
def test_reward_settings_that_do_not_fit_are_refused_naming_the_field(
        reward: dict[str, Any], words: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(_spec(reward))
    assert words in str(err.value)
