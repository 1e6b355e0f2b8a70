"""Trainer config: precedence (file < --set < GRPO_* env) and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_trainer.config import build_config, check_runtime, load_config
from grpo_trainer.config_error import ConfigError

pytestmark = pytest.mark.unit

BASE = {"model": {"path": "m"}, "data": {"train_files": ["a.jsonl"]}}


def test_set_overrides_file_and_env_overrides_set() -> None:
    cfg = build_config(BASE, ["actor.micro_batch_size=4", "rollout.n=4"], environ={})
    assert cfg.actor.micro_batch_size == 4 and cfg.rollout.n == 4
    env = {"GRPO_CHECKPOINT_DIR": "/ck", "GRPO_ATTEMPT": "3"}
    cfg = build_config(BASE, ["checkpoint.dir=/elsewhere"], environ=env)
    assert cfg.checkpoint.dir == "/ck" and cfg.trainer.attempt == 3


def test_planned_settings_come_from_the_file_only() -> None:
    """One channel: a GRPO_* variable named like a planned knob is not read."""
    env = {"GRPO_MICRO_BATCH_SIZE": "1", "GRPO_GRADIENT_CHECKPOINTING": "true"}
    cfg = build_config(BASE, ["actor.micro_batch_size=4"], environ=env)
    assert cfg.actor.micro_batch_size == 4 and not cfg.actor.gradient_checkpointing


@pytest.mark.parametrize(
    ("raw", "sets", "field"),
    [
        (BASE, ["actor.learning_rate=1"], "actor.learning_rate"),
        ({**BASE, "bogus": {}}, [], "bogus"),
        (BASE, ["rollout.n=1"], "rollout.n"),
        (
            BASE,
            ["trainer.rollout_batch_size=3", "resources.num_workers=2"],
            "trainer.rollout_batch_size",
        ),
        (BASE, ["actor.micro_batch_size=3"], "actor.micro_batch_size"),
        (BASE, ["actor.mini_batch_size=5"], "actor.mini_batch_size"),
        ({"data": {"train_files": ["a"]}}, [], "model"),
        (BASE, ["reward.type=function"], "reward.function"),
    ],
)
def test_bad_config_names_the_field(raw: dict, sets: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config(raw, sets, environ={})
    assert err.value.field == field, str(err.value)


def test_env_value_of_wrong_type_is_reported_against_its_field() -> None:
    with pytest.raises(ConfigError) as err:
        build_config(BASE, [], environ={"GRPO_ATTEMPT": "lots"})
    assert err.value.field == "trainer.attempt"


def test_missing_data_file_is_a_runtime_config_error(tmp_path: Path) -> None:
    cfg = build_config(BASE, [f"data.train_files=[{tmp_path / 'nope.jsonl'}]"], environ={})
    with pytest.raises(ConfigError) as err:
        check_runtime(cfg)
    assert err.value.field == "data.train_files[0]"


def test_load_config_reads_yaml(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("model: {path: m}\ndata: {train_files: [a]}\nrollout: {n: 4}\n")
    assert load_config(p, environ={}).rollout.n == 4
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "missing.yaml", environ={})
    assert err.value.field == "--config"


def test_flash_attention_is_refused_naming_the_field_and_the_fix() -> None:
    """flash_attention_2 silently turned shared-prefix packing off and broke the hf
    engine's 4-D decode mask; sdpa already runs PyTorch's flash kernel on A100/H100."""
    with pytest.raises(ConfigError) as err:
        build_config(BASE, ["model.attn_implementation=flash_attention_2"], environ={})
    assert err.value.field == "model.attn_implementation"
    assert "4-D attention masks" in err.value.message and "Use sdpa" in err.value.message
    assert build_config(BASE, [], environ={}).model.attn_implementation == "sdpa"
