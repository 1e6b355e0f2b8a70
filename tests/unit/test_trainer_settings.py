"""The EasyR1-style settings (spec.algorithm, spec.training, spec.reward, spec.data) reach
the trainer config as they are, within the trainer schema's own bounds; written in the
deprecated spec.trainer by their old names they still do, with a warning; a planned or
rendered setting written there is refused at apply naming the spec field that sets it."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from grpo_api.job import parse_spec
from grpo_api.job.renames import RENAMED_TO
from grpo_api.job.trainer import PASSED, config_sources
from grpo_api.trainer_config import Config
from grpo_operator.planner import plan_memory
from grpo_operator.render import JobRef
from grpo_operator.render.trainer_config import trainer_config
from grpo_operator.webhook import admission_problem, admission_warnings
from grpo_testbed.examples import example_job

pytestmark = pytest.mark.unit

TINY = example_job()["spec"]
GPU = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]
SETTINGS = {"data.promptTemplate": "r1v", "algorithm.entropyCoef": 0.001,
            "algorithm.clipRatioDual": 4.0, "algorithm.klEstimator": "k3",
            "algorithm.normAdvByStd": False, "training.warmupSteps": 3,
            "algorithm.ppoEpochs": 2, "reward.timeoutSeconds": 5.5, "reward.workers": 2,
            "training.valBeforeTrain": False, "algorithm.offpolicyIsCap": 1.5}
OLD_NAME = {new: old for old, new in RENAMED_TO.items()}


def spec_with(base: dict[str, Any], **sections: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    out.update(copy.deepcopy(sections))
    return out


def setting(base: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """``base`` with the wire path ``path`` under spec set to ``value``."""
    out = copy.deepcopy(base)
    *parents, last = path.split(".")
    node = out
    for key in parents:
        node = node.setdefault(key, {})
    node[last] = value
    return out


def rendered(spec: dict[str, Any]) -> dict[str, Any]:
    parsed = parse_spec(spec)
    return trainer_config(parsed, plan_memory(parsed), JobRef("j", "ns", "uid-1"))


def test_each_setting_reaches_its_trainer_config_path() -> None:
    assert set(PASSED) == set(SETTINGS)
    spec = TINY
    for path, value in SETTINGS.items():
        spec = setting(spec, path, value)
    cfg = rendered(spec)
    for spec_path, path in PASSED.items():
        section, key = path.split(".")
        assert cfg[section][key] == SETTINGS[spec_path], path
    Config.model_validate(cfg)


def test_the_old_spec_trainer_names_still_set_them_with_a_warning() -> None:
    old = spec_with(TINY, trainer={OLD_NAME[p].removeprefix("trainer."): v
                                   for p, v in SETTINGS.items()})
    new = TINY
    for path, value in SETTINGS.items():
        new = setting(new, path, value)
    assert rendered(old) == rendered(new)
    warned = admission_warnings(old)
    for path in SETTINGS:
        assert f"spec.{OLD_NAME[path]} is renamed: write spec.{path}" in " ".join(warned), path
    assert not [w for w in admission_warnings(new) if "renamed" in w]


def test_a_function_reward_gets_the_configured_prompt_template() -> None:
    assert TINY["reward"]["type"] == "function"
    assert rendered(TINY)["data"]["format_prompt"] == "plain"  # the default for function
    template = "/etc/prompts/geo.jinja"
    cfg = rendered(setting(TINY, "data.promptTemplate", template))
    assert cfg["data"]["format_prompt"] == template


@pytest.mark.parametrize(("path", "value"), [
    ("algorithm.ppoEpochs", 0), ("training.warmupSteps", -1), ("algorithm.entropyCoef", -0.1),
    ("algorithm.clipRatioDual", 1.0), ("reward.timeoutSeconds", 0), ("reward.workers", 0),
    ("algorithm.klEstimator", "k2"), ("data.promptTemplate", "prompts/geo.jinja"),
])
def test_an_invalid_setting_is_refused_naming_its_field(path: str, value: Any) -> None:
    problem = admission_problem(setting(TINY, path, value), None)
    assert problem is not None and f"spec.{path}" in problem, problem
    # Written by its old name, the refusal names the field it moved to.
    problem = admission_problem(setting(TINY, OLD_NAME[path], value), None)
    assert problem is not None and f"spec.{path}" in problem, problem


def test_the_bounds_are_the_trainer_schemas() -> None:
    """A value the trainer's own schema refuses is refused at apply, and the least value
    it takes is taken: the spec carries the schema's bounds, no copy of them."""
    for spec_path, path in PASSED.items():
        section, key = path.split(".")
        info = Config.model_fields[section].annotation.model_fields[key]  # type: ignore[union-attr]
        for m in info.metadata:
            for bound, outside, inside in (("ge", -1, 0), ("gt", 0, 0.5)):
                if getattr(m, bound, None) is None:
                    continue
                edge = getattr(m, bound)
                bad, good = edge + outside, edge + inside
                if isinstance(edge, int) and info.annotation in (int, int | None):
                    good = int(edge + 1) if bound == "gt" else edge
                assert admission_problem(setting(TINY, spec_path, bad), None) is not None, \
                    (path, bad)
                assert admission_problem(setting(TINY, spec_path, good), None) is None, \
                    (path, good)


@pytest.mark.parametrize(("written", "use"), [
    ("microBatchSize", "spec.memory.microBatchSize"),
    ("micro_batch_size", "spec.memory.microBatchSize"),
    ("gradientCheckpointing", "spec.memory.gradientCheckpointing"),
    ("lr", "spec.training.learningRate"),
    ("learningRate", "spec.training.learningRate"),
    ("klCoef", "spec.algorithm.klCoef"),
    ("rolloutBatchSize", "spec.training.rolloutBatchSize"),
    ("miniBatchSize", "spec.training.globalBatchSize"),
    ("maxPromptLength", "spec.data.maxPromptLength"),
    ("max_new_tokens", "spec.data.maxResponseLength"),
    ("n", "spec.algorithm.rolloutN"),
])
def test_a_planned_setting_is_refused_naming_the_spec_field_to_use(written: str,
                                                                    use: str) -> None:
    problem = admission_problem(spec_with(TINY, trainer={written: 1}), None)
    assert problem is not None, written
    assert f"spec.trainer.{written}: unknown field" in problem, problem
    assert f"from {use}; set that instead" in problem, problem


def test_a_setting_spelt_the_trainers_way_is_told_its_field() -> None:
    problem = admission_problem(spec_with(TINY, trainer={"entropy_coef": 0.1}), None)
    assert problem is not None and "write it as spec.algorithm.entropyCoef" in problem, problem


@pytest.mark.parametrize("spec", [
    TINY, GPU,
    setting(spec_with(GPU, lora={}, data={**GPU["data"], "val": "/data/val.parquet"},
                      training={**GPU["training"], "valIntervalSteps": 5},
                      logging={"tensorboard": True, "wandb": {"project": "p"},
                               "mlflow": {"trackingUri": "http://mlflow:5000"}}),
            "algorithm.entropyCoef", 0.01),
], ids=["tiny", "7b", "7b-lora-val-logging-entropy"])
def test_every_rendered_path_names_the_spec_field_that_sets_it(spec: dict[str, Any]) -> None:
    """So a refusal of the rendered config, or a planned setting written in spec.trainer,
    can always name the field to change."""
    cfg = rendered(spec)
    paths = {f"{section}.{key}" for section, keys in cfg.items() for key in keys}
    assert not paths - set(config_sources())


def test_an_entropy_bonus_costs_the_update_no_memory() -> None:
    """The chunked log-prob head computes the entropy in the same chunks as the log-probs,
    and with entropyCoef > 0 its gradient in the same two float32 buffers (tests/unit/
    test_lean_logprobs.py measures both passes): the plan is the same with the bonus."""
    def logits(coef: float | None) -> float:
        spec = spec_with(GPU, memory={**GPU.get("memory", {}), "microBatchSize": 2})
        if coef is not None:
            spec = setting(spec, "algorithm.entropyCoef", coef)
        return plan_memory(parse_spec(spec)).budget.gpu_stages["training"]["logits"]

    assert logits(0.01) == logits(None) == logits(0.0) > 0


def test_the_algorithm_cannot_change_on_a_live_job_but_its_old_names_may_move() -> None:
    old = setting(TINY, "algorithm.ppoEpochs", 1)
    problem = admission_problem(setting(TINY, "algorithm.ppoEpochs", 2), old)
    assert problem is not None and "spec.algorithm" in problem, problem
    # A live job's manifest rewritten with the new names, same values: nothing changed.
    written_old = spec_with(TINY, trainer={"ppoEpochs": 1})
    assert admission_problem(old, written_old) is None
