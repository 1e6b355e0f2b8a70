"""Reward functions in every form (ours of the answer or of the whole row, per response
or per step; EasyR1's; verl's) and the crash-tolerant runner (docs/rewards.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_api.trainer_config import DataConfig, RewardConfig
from grpo_trainer.config_error import ConfigError
from grpo_trainer.data import Record
from grpo_trainer.rewards import RewardResult, RewardSample, reward_rows, reward_runner
from grpo_trainer.rewards.math_answer import extract_boxed, math_reward
from grpo_trainer.rewards.r1v import r1v_reward
from grpo_trainer.tiny.data import png

pytestmark = pytest.mark.unit

REWARDS = Path(__file__).parents[1] / "rewards"  # reward files as other frameworks write them
DATA = DataConfig(train_files=["unused.jsonl"])


def samples(*rows: tuple[str, str, dict[str, object]], images: int = 0,
            responses: tuple[str, ...] = ("the answer is 7",)) -> list[RewardSample]:
    """Each (prompt, answer, other columns) row with ``images`` PNGs, answered by each of
    ``responses``."""
    records = [Record(i, p, a, images=[png((i, 0, 0), (30 + i, 20)) for _ in range(images)])
               for i, (p, a, _) in enumerate(rows)]
    out = []
    for row, (_, _, extra) in zip(reward_rows(records, DATA, whole=True), rows, strict=True):
        row.columns = {**row.columns, **extra}
        out += [RewardSample(r, len(r.split()), row) for r in responses]
    return out


def run(cfg: RewardConfig, batch: list[RewardSample]) -> list[RewardResult]:
    runner = reward_runner(cfg)
    try:
        return runner.score(batch)
    finally:
        runner.close()


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
    cfg = RewardConfig(type="function", function="grpo_testkit.rewards:crashing_reward")
    out = run(cfg, samples(("p", "x", {}), responses=("ab", "abc")))
    assert out[0].score == 0.5 and out[0].failed is None
    assert out[1].score == 0.0 and "deliberate failure" in (out[1].failed or "")
    assert "failed for 1 of 2 responses" in caplog.text and "deliberate failure" in caplog.text


def test_unimportable_function_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        reward_runner(RewardConfig(type="function", function="no.such.module:f"))
    assert err.value.field == "reward.function"


def test_a_missing_reward_file_names_the_path_and_how_to_ship_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        reward_runner(RewardConfig(type="function", function=f"{tmp_path}/r.py:score"))
    assert err.value.field == "reward.function"
    assert f"{tmp_path}/r.py does not exist" in str(err.value) and "ConfigMap" in str(err.value)


def test_a_function_of_one_argument_gets_the_whole_row_and_its_images() -> None:
    cfg = RewardConfig(type="function", function=f"{REWARDS}/row_reader.py:score")
    batch = samples(("<image>what?", "7", {"weight": 2.0}), ("<image>and?", "3", {"weight": 5.0}),
                    images=1)
    out = run(cfg, batch)
    # row 0: "7" said, weight 2, one image 30 px wide; row 1: "3" not said, 31 px.
    assert [r.score for r in out] == [pytest.approx(2.0 + 0.030), pytest.approx(0.031)]
    assert [r.accuracy for r in out] == [1.0, 0.0]
    assert reward_runner(cfg).reads_rows


def test_a_two_argument_function_reads_only_the_answer_column() -> None:
    runner = reward_runner(
        RewardConfig(type="function", function="grpo_trainer.rewards.mentions:mentions_answer"))
    assert not runner.reads_rows
    assert runner.score(samples(("p", "7", {})))[0].score == 0.25
    runner.close()


def test_a_batch_function_is_called_once_per_step_with_every_response() -> None:
    calls: list[int] = []

    def counted(ss: list[RewardSample]) -> list[float]:
        calls.append(len(ss))
        return [float(len(s.response)) for s in ss]

    import sys
    import types
    sys.modules["counted_reward"] = types.SimpleNamespace(score=counted)  # type: ignore[assignment]
    cfg = RewardConfig(type="function", function="counted_reward:score", batch=True)
    out = run(cfg, samples(("p", "7", {}), ("q", "8", {}), responses=("a", "bb", "ccc")))
    assert calls == [6] and [r.score for r in out] == [1.0, 2.0, 3.0] * 2


def test_a_batch_function_that_fails_or_miscounts_scores_the_step_zero(
        caplog: pytest.LogCaptureFixture) -> None:
    import sys
    import types
    sys.modules["bad_batch"] = types.SimpleNamespace(  # type: ignore[assignment]
        short=lambda ss: [1.0], boom=lambda ss: 1 / 0)
    batch = samples(("p", "7", {}), responses=("a", "b"))
    short = run(RewardConfig(type="function", function="bad_batch:short", batch=True), batch)
    assert [r.score for r in short] == [0.0, 0.0]
    assert short[0].failed == "returned 1 scores for 2 responses"
    boom = run(RewardConfig(type="function", function="bad_batch:boom", batch=True), batch)
    assert all(r.failed and "ZeroDivisionError" in r.failed for r in boom)
    assert "failed for 2 of 2 responses" in caplog.text


def test_a_score_that_is_no_number_or_nan_fails_the_sample() -> None:
    import sys
    import types
    sys.modules["odd_scores"] = types.SimpleNamespace(  # type: ignore[assignment]
        nan=lambda r, t: float("nan"), text=lambda r, t: "high", nokey=lambda r, t: {"x": 1})
    for name, why in (("nan", "returned nan"), ("text", "returned str"),
                      ("nokey", "without 'overall'")):
        res = run(RewardConfig(type="function", function=f"odd_scores:{name}"),
                  samples(("p", "7", {})))[0]
        assert res.score == 0.0 and why in (res.failed or ""), name


def test_an_easyr1_batch_reward_runs_unchanged_with_its_kwargs() -> None:
    cfg = RewardConfig(type="easyr1", function=f"{REWARDS}/easyr1_style.py:compute_score",
                       batch=True, kwargs={"format_weight": 0.5})
    runner = reward_runner(cfg)
    assert not runner.reads_rows  # EasyR1 gives its functions the answer, not the row
    out = runner.score(samples(("p", "7", {}), responses=("<answer>7</answer> ok", "no")))
    runner.close()
    assert [r.score for r in out] == [1.0, 0.0]
    assert out[0].accuracy == 1.0 and out[0].extras == {"format": 1.0, "length": 2.0}
    # The same file with EasyR1's per-response form refuses, as it does in EasyR1.
    one = run(cfg.model_copy(update={"batch": False}), samples(("p", "7", {})))[0]
    assert one.failed and "reward_type=batch" in one.failed


def test_a_verl_compute_score_runs_unchanged_with_data_source_and_extra_info() -> None:
    cfg = RewardConfig(type="verl", function=f"{REWARDS}/verl_style.py:compute_score",
                       kwargs={"bonus": 0.25})
    batch = samples(("p", "7", {"data_source": "tiny/plain"}),
                    ("q", "7", {"data_source": "tiny/weighted", "extra_info": {"weight": 3}}),
                    ("r", "7", {"data_source": "elsewhere"}))
    out = run(cfg, batch)
    assert out[0].score == 1.0 and out[0].accuracy is None
    assert out[1].score == 3.25 and out[1].accuracy == 1.0 and out[1].extras == {"weight": 3.0}
    assert out[2].failed and "NotImplementedError" in out[2].failed


def test_a_verl_layout_row_gives_its_ground_truth_from_reward_model(tmp_path: Path) -> None:
    import json

    from grpo_trainer.dataset import RowRef
    from grpo_trainer.rewards import samples_for
    path = tmp_path / "verl.jsonl"
    path.write_text(json.dumps({"prompt": "Say 7", "data_source": "tiny/plain",
                                "reward_model": {"ground_truth": "7", "style": "rule"}}) + "\n")
    data = DataConfig(train_files=[str(path)], prompt_key="prompt", answer_key="reward_model")
    rows = reward_rows([RowRef(0, str(path), 0, 0)], data, whole=True)
    assert (rows[0].prompt, rows[0].ground_truth) == ("Say 7", "7")
    cfg = RewardConfig(type="verl", function=f"{REWARDS}/verl_style.py:compute_score")
    outs = [{"text": "it is 7", "response_tokens": 3, "index": 0},
            {"text": "it is 8", "response_tokens": 3, "index": 0}]
    assert [r.score for r in run(cfg, samples_for(outs, rows))] == [1.0, 0.0]


@pytest.mark.parametrize(("settings", "problem"), [
    ({"type": "verl"}, "reward.function: required when type is verl"),
    ({"type": "math", "function": "m:f"}, "reward.function: only for type function"),
    ({"type": "verl", "function": "m:f", "batch": True}, "reward.batch: only for type"),
    ({"type": "r1v", "kwargs": {"a": 1}}, "reward.kwargs: only for type"),
    ({"type": "http"}, "reward.http: required when type is http"),
    ({"type": "function", "function": "rewards/m.py:f"}, "function"),  # not absolute
])
def test_reward_settings_that_do_not_fit_the_type_are_refused(
        settings: dict[str, object], problem: str) -> None:
    from pydantic import ValidationError
    with pytest.raises(ValidationError, match=problem.replace(".", r"\.")):
        RewardConfig.model_validate(settings)


def test_a_two_argument_function_with_batch_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as err:
        reward_runner(RewardConfig(type="function", batch=True,
                                   function="grpo_trainer.rewards.mentions:mentions_answer"))
    assert err.value.field == "reward.batch" and "takes 2 arguments" in str(err.value)
