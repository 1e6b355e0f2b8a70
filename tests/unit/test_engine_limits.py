"""A model vLLM's CPU backend cannot run is a config error (exit 2) before any work starts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import ExitCode
from grpo_api.model.config_json import head_dim
from grpo_trainer.config import build_config, check_runtime
from grpo_trainer.config_error import ConfigError
from grpo_trainer.rollout.engine_limits import VLLM_CPU_HEAD_SIZES, vllm_cpu_problem
from grpo_trainer.run import run_training

pytestmark = pytest.mark.unit

# The trainer tier's tiny Qwen2: 4 heads of 16.
HEAD_16 = {"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4}


def _model(tmp_path: Path, config: dict[str, Any]) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return model


def _cfg(tmp_path: Path, model: Path, *sets: str) -> Any:
    data = tmp_path / "train.jsonl"
    data.write_text('{"prompt": "1+1", "answer": "2"}\n')
    raw = {"model": {"path": str(model)}, "data": {"train_files": [str(data)]}}
    return build_config(raw, list(sets), environ={})


@pytest.mark.parametrize(
    ("config", "dim"),
    [
        (HEAD_16, 16),
        ({**HEAD_16, "head_dim": 128}, 128),  # given explicitly: wins over hidden / heads
        # A VLM: the language model's text_config, not the top level (the vision tower's).
        ({"hidden_size": 1280, "num_attention_heads": 16, "text_config": HEAD_16}, 16),
        ({"model_type": "mystery"}, None),
    ],
)
def test_head_dim_from_config_json(config: dict[str, Any], dim: int | None) -> None:
    assert head_dim(config) == dim


def test_only_vllms_cpu_head_sizes_pass() -> None:
    assert all(vllm_cpu_problem({"head_dim": d}) is None for d in VLLM_CPU_HEAD_SIZES)
    assert vllm_cpu_problem({"head_dim": 48}) is not None  # >= 32 is not enough
    assert vllm_cpu_problem({}) is None  # unknown: the engine decides


def test_vllm_on_cpu_with_head_dim_16_names_engine_head_dim_and_fix(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, _model(tmp_path, HEAD_16), "rollout.engine=vllm")
    with pytest.raises(ConfigError) as err:
        check_runtime(cfg)
    msg = str(err.value)
    assert err.value.field == "rollout.engine"
    assert "head_dim is 16" in msg and "rollout.engine: hf" in msg, msg


@pytest.mark.parametrize(
    "sets",
    [
        ("rollout.engine=hf",),  # the hf engine runs any head size
        ("rollout.engine=vllm", "resources.gpus_per_worker=1"),  # CUDA: not this limit
    ],
)
def test_other_engines_and_gpus_accept_head_dim_16(tmp_path: Path, sets: tuple[str, ...]) -> None:
    check_runtime(_cfg(tmp_path, _model(tmp_path, HEAD_16), *sets))


def test_vllm_on_cpu_accepts_head_dim_32(tmp_path: Path) -> None:
    model = _model(tmp_path, {**HEAD_16, "hidden_size": 128})
    check_runtime(_cfg(tmp_path, model, "rollout.engine=vllm"))


def test_grpo_train_exits_2_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import ray

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started"))
    cfg = _cfg(tmp_path, _model(tmp_path, HEAD_16), "rollout.engine=vllm")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    term = tmp_path / "termination-log"
    monkeypatch.setenv("GRPO_TERMINATION_LOG", str(term))
    assert run_training(str(path)) == ExitCode.CONFIG_ERROR == 2
    err = capsys.readouterr().err
    assert "config error: rollout.engine:" in err and "head_dim is 16" in err, err
    assert "head_dim is 16" in term.read_text()


def test_grpo_train_alone_refuses_a_family_it_does_not_train_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The family list is grpo_api.model.families, the operator's admission list too."""
    import ray

    from grpo_api.model.families import SUPPORTED
    from grpo_testkit.tiny_configs import write_config

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("Ray started"))
    model = write_config(tmp_path / "llama", "llama").parent
    cfg = _cfg(tmp_path, model, "rollout.engine=hf")
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    monkeypatch.setenv("GRPO_TERMINATION_LOG", str(tmp_path / "termination-log"))
    assert run_training(str(path)) == ExitCode.CONFIG_ERROR
    err = capsys.readouterr().err
    assert "config error: model.path: config.json says model_type 'llama'" in err, err
    assert all(f"({family})" in err for family in SUPPORTED), err
    # A family it trains passes the same check (the tiny Qwen2 of the trainer tier).
    check_runtime(_cfg(tmp_path, write_config(tmp_path / "qwen2", "qwen2").parent))
