"""Every family the trainer trains is planned from a config.json that transformers wrote:
config.json -> shape_from_config -> plan, each count equal to the model the trainer
builds from that directory (its own meta-device path), and any other architecture
refused, naming it and the families it trains."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from grpo_api.job import SpecError, parse_spec
from grpo_api.trainer_config import ModelConfig
from grpo_operator.planner import SUPPORTED, UnsupportedArchitecture, plan_memory, shape_from_config
from grpo_operator.reconcile import planned
from grpo_testkit.tiny_configs import SUPPORTED_FAMILIES, write_config

pytestmark = pytest.mark.unit


def spec(path: str = "/models/acme-sft") -> dict[str, Any]:
    """A CPU job on a model no table knows (its name says nothing)."""
    return {
        "model": {"path": path, "claimName": "models"},
        "data": {"train": "/models/data/train.parquet", "maxPromptLength": 256,
                 "maxResponseLength": 16, "maxPixels": 12544},
        "algorithm": {"rolloutN": 4},
        "training": {"rolloutBatchSize": 4, "globalBatchSize": 16},
        "resources": {"gpuType": "cpu", "nodes": 0, "gpusPerNode": 2, "cpusPerNode": 2,
                      "hostMemory": "16Gi"},
        "checkpoint": {"size": "1Gi"},
    }  # fmt: skip


def written(tmp_path: Path, family: str) -> dict[str, Any]:
    return dict(json.loads(write_config(tmp_path / family, family).read_text()))


def test_the_supported_families_are_the_ones_the_tests_build() -> None:
    assert set(SUPPORTED) == set(SUPPORTED_FAMILIES)


@pytest.mark.parametrize("family", SUPPORTED_FAMILIES)
def test_a_transformers_config_sizes_the_model_the_trainer_builds(
        tmp_path: Path, family: str) -> None:
    """Every memory term is bytes per parameter x these counts, and FSDP2's buffers use
    one block's: equal to the model the trainer builds on the meta device from the
    same directory (vision tower, its mergers, norms, biases, MoE experts included), and
    the trainer shards exactly the decoder layers and vision blocks the planner counts."""
    from grpo_trainer.model.modeling import _blocks, _build_on_meta

    config = written(tmp_path, family)
    assert config["model_type"] == family
    model = _build_on_meta(ModelConfig(path=str(tmp_path / family)))
    params = dict(model.named_parameters())
    shape = shape_from_config(config)
    assert shape.parameters == sum(p.numel() for p in params.values())
    visual = {n: p for n, p in params.items() if ".visual." in n}
    assert shape.vision_parameters == sum(p.numel() for p in visual.values())
    units = {id(b) for b in _blocks(model)}
    named = {n: m for n, m in model.named_modules() if id(m) in units}
    layers = [m for n, m in named.items() if ".visual." not in n]
    towers = [m for n, m in named.items() if ".visual." in n]
    assert (len(layers), len(towers)) == (shape.layers, shape.vision_layers if visual else 0)
    # One decoder layer: the planner spreads the final norm over them (under h each).
    layer = sum(p.numel() for p in layers[0].parameters())
    assert 0 <= shape.layer_parameters - layer < shape.hidden_size
    if visual:
        assert shape.vision_block_parameters == sum(p.numel() for p in towers[0].parameters())


@pytest.mark.parametrize("family", SUPPORTED_FAMILIES)
def test_a_job_on_an_unknown_name_is_planned_from_its_config(
        tmp_path: Path, family: str) -> None:
    config = written(tmp_path, family)
    where = "claim config.json (claim models:/models/acme-sft/config.json)"
    plan = planned(parse_spec(spec()), model=_input(config, where))
    assert plan.geometry.shape.parameters == shape_from_config(config).parameters
    assert plan.geometry.shape_source == where
    model = next(d for d in plan.decisions if d.knob == "model")
    assert model.reason.endswith(f"from {where}")


def _input(config: dict[str, Any] | None, source: str) -> Any:
    from grpo_operator.reconcile.model_config import PlanInput

    return PlanInput(config, source)


def test_another_architecture_is_refused_naming_it_and_the_supported_ones(
        tmp_path: Path) -> None:
    config = written(tmp_path, "llama")
    with pytest.raises(UnsupportedArchitecture) as info:
        shape_from_config(config)
    message = str(info.value)
    assert "model_type 'llama'" in message and "LlamaForCausalLM" in message
    for family in SUPPORTED.values():
        assert f"{family.name} ({family.model_type})" in message
    with pytest.raises(SpecError, match=r"spec\.model\.path: config\.json says model_type "
                                        r"'llama'"):
        planned(parse_spec(spec()), model=_input(config, "hub config.json (x)"))


def test_a_supported_type_with_another_head_is_refused(tmp_path: Path) -> None:
    config = written(tmp_path, "qwen2") | {"architectures": ["Qwen2ForSequenceClassification"]}
    with pytest.raises(UnsupportedArchitecture, match=re.escape(
            "loads Qwen2/Qwen2.5 text as Qwen2ForCausalLM only")):
        plan_memory(parse_spec(spec()), model_config=config)
