"""spec.trainer: EasyR1-style settings reach the trainer config as they are, within the
trainer schema's own bounds; a planned or rendered setting written there is refused at
apply naming the spec field that sets it."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from pydantic.alias_generators import to_camel

from grpo_api.job import parse_spec
from grpo_api.job.trainer import TRAINER_PATHS, config_sources
from grpo_api.trainer_config import Config
from grpo_operator.planner import plan_memory
from grpo_operator.render import JobRef
from grpo_operator.render.trainer_config import trainer_config
from grpo_operator.webhook import admission_problem
from grpo_testbed.examples import example_job

pytestmark = pytest.mark.unit

TINY = example_job()["spec"]
GPU = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]


def spec_with(base: dict[str, Any], **sections: Any) -> dict[str, Any]:
    out = copy.deepcopy(base)
    out.update(copy.deepcopy(sections))
    return out


def rendered(spec: dict[str, Any]) -> dict[str, Any]:
    parsed = parse_spec(spec)
    return trainer_config(parsed, plan_memory(parsed), JobRef("j", "ns", "uid-1"))


def test_each_setting_reaches_its_trainer_config_path() -> None:
    settings = {"formatPrompt": "r1v", "entropyCoef": 0.001, "clipRatioDual": 4.0,
                "klEstimator": "k3", "normAdvByStd": False, "warmupSteps": 3,
                "ppoEpochs": 2, "rewardTimeoutSeconds": 5.5, "rewardWorkers": 2,
                "valBeforeTrain": False, "offpolicyIsCap": 1.5}
    assert {to_camel(n) for n in TRAINER_PATHS} == set(settings)
    cfg = rendered(spec_with(TINY, trainer=settings))
    for name, path in TRAINER_PATHS.items():
        section, key = path.split(".")
        assert cfg[section][key] == settings[to_camel(name)], path
    Config.model_validate(cfg)


def test_a_function_reward_gets_the_configured_format_prompt() -> None:
    assert TINY["reward"]["type"] == "function"
    assert rendered(TINY)["data"]["format_prompt"] == "plain"  # the default for function
    template = "/etc/prompts/geo.jinja"
    cfg = rendered(spec_with(TINY, trainer={"formatPrompt": template}))
    assert cfg["data"]["format_prompt"] == template


@pytest.mark.parametrize(("setting", "value"), [
    ("ppoEpochs", 0), ("warmupSteps", -1), ("entropyCoef", -0.1), ("clipRatioDual", 1.0),
    ("rewardTimeoutSeconds", 0), ("rewardWorkers", 0), ("klEstimator", "k2"),
    ("formatPrompt", "prompts/geo.jinja"),
])
def test_an_invalid_setting_is_refused_naming_its_field(setting: str, value: Any) -> None:
    problem = admission_problem(spec_with(TINY, trainer={setting: value}), None)
    assert problem is not None and f"spec.trainer.{setting}" in problem, problem


def test_the_bounds_are_the_trainer_schemas() -> None:
    """A value the trainer's own schema refuses is refused at apply, and the least value
    it takes is taken: the spec carries the schema's bounds, no copy of them."""
    for name, path in TRAINER_PATHS.items():
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
                assert admission_problem(spec_with(TINY, trainer={to_camel(name): bad}),
                                         None) is not None, (path, bad)
                assert admission_problem(spec_with(TINY, trainer={to_camel(name): good}),
                                         None) is None, (path, good)


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
    assert problem is not None and "write it as entropyCoef" in problem, problem


@pytest.mark.parametrize("spec", [
    TINY, GPU,
    spec_with(GPU, lora={}, data={**GPU["data"], "val": "/data/val.parquet"},
              training={**GPU["training"], "valIntervalSteps": 5},
              logging={"tensorboard": True, "wandb": {"project": "p"},
                       "mlflow": {"trackingUri": "http://mlflow:5000"}},
              trainer={"entropyCoef": 0.01}),
], ids=["tiny", "7b", "7b-lora-val-logging-trainer"])
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
    def logits(trainer: dict[str, Any]) -> float:
        memory = {**GPU.get("memory", {}), "microBatchSize": 2}
        plan = plan_memory(parse_spec(spec_with(GPU, trainer=trainer, memory=memory)))
        return plan.budget.gpu_phases["training"]["logits"]

    assert logits({"entropyCoef": 0.01}) == logits({}) == logits({"entropyCoef": 0.0}) > 0


def test_spec_trainer_cannot_change_on_a_live_job() -> None:
    old = spec_with(TINY, trainer={"ppoEpochs": 1})
    problem = admission_problem(spec_with(TINY, trainer={"ppoEpochs": 2}), old)
    assert problem is not None and "spec.trainer" in problem, problem
