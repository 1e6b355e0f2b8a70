"""Reward functions and the crash-tolerant runner."""

from __future__ import annotations

import pytest

from grpo_api.trainer_config import RewardConfig
from grpo_trainer.rewards import RewardRunner, resolve_reward_fn
from grpo_trainer.rewards.math_answer import extract_boxed, math_reward
from grpo_trainer.rewards.r1v import r1v_reward

pytestmark = pytest.mark.unit


def test_math_reward_weights_accuracy_and_format() -> None:
    good = "<think>2 and 2</think> so \\boxed{4}"
    assert math_reward(good, "4") == {"overall": 1.0, "format": 1.0, "accuracy": 1.0}
    assert math_reward("\\boxed{4}", "4")["overall"] == pytest.approx(0.9)
    assert math_reward("<think>x</think> \\boxed{5}", "4")["overall"] == pytest.approx(0.1)
    assert math_reward("no answer", "4")["overall"] == 0.0


def test_boxed_answers_are_normalised() -> None:
    assert extract_boxed("a \\boxed{1} b \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert math_reward("\\boxed{\\frac{1}{2}}", "0.5")["accuracy"] == 1.0
    assert math_reward("\\boxed{ 12 }", "\\boxed{12}")["accuracy"] == 1.0
    assert math_reward("\\boxed{1,000}", "1000")["accuracy"] == 1.0


def test_r1v_reward_uses_answer_tags() -> None:
    assert r1v_reward("<think>hm</think><answer>3</answer>", "3")["overall"] == 1.0
    assert r1v_reward("<answer>3</answer>", "3")["overall"] == pytest.approx(0.9)
    assert r1v_reward("<think>hm</think><answer>2</answer>", "3")["accuracy"] == 0.0


def test_crashing_user_function_fails_only_its_sample(caplog: pytest.LogCaptureFixture) -> None:
    fn = resolve_reward_fn(
        RewardConfig(type="function", function="grpo_trainer.testing.rewards:crashing_reward")
    )
    runner = RewardRunner(fn, num_workers=2, timeout_s=5)
    out = runner.score(["ab", "abc"], ["x", "x"])
    runner.close()
    assert out[0].score == 0.5 and out[0].failed is None
    assert out[1].score == 0.0 and "deliberate failure" in (out[1].failed or "")
    assert "deliberate failure" in caplog.text


def test_unimportable_function_is_a_config_error() -> None:
    from grpo_trainer.config_error import ConfigError

    with pytest.raises(ConfigError) as err:
        resolve_reward_fn(RewardConfig(type="function", function="no.such.module:f"))
    assert err.value.field == "reward.function"
