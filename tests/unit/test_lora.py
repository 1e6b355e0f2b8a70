"""LoRA adapters without ranks: which layers are adapted, what the adapted model computes,
merging, the reference (adapters off) and PEFT's on-disk names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from grpo_api.trainer_config import LoraConfig
from grpo_trainer.errors import ExitCode, classify
from grpo_trainer.lora import (
    NoTargets,
    adapters_disabled,
    attach_adapters,
    is_adapter_param,
    merge_state,
    merge_stream,
    reset_adapters,
    target_names,
)
from grpo_trainer.lora.checkpoint import state_dict_options
from grpo_trainer.lora.peft_format import write_adapter_dir


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(8, 8)
        self.down_proj = nn.Linear(8, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(torch.relu(self.q_proj(x)))


class TinyVLM(nn.Module):
    """Language layers, a "visual" tower with the same layer names, an LM head."""

    def __init__(self) -> None:
        super().__init__()
        self.visual = Block()
        self.layers = nn.ModuleList([Block(), Block()])
        self.lm_head = nn.Linear(8, 16, bias=False)

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.visual(x)
        for layer in self.layers:
            x = x + layer(x)
        out: torch.Tensor = self.lm_head(x)
        return out


def _model() -> TinyVLM:
    torch.manual_seed(0)
    return TinyVLM()


def _train_adapters(model: nn.Module) -> None:
    """Non-zero B everywhere, as after some training (B starts at zero)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("lora_B.weight"):
                p.normal_(0, 0.5)


def test_all_linear_adapts_the_language_layers_but_not_the_head_or_vision_tower() -> None:
    names = target_names(_model(), LoraConfig())
    assert names == [
        "layers.0.q_proj",
        "layers.0.down_proj",
        "layers.1.q_proj",
        "layers.1.down_proj",
    ]


def test_named_targets_match_by_suffix_and_exclusion_can_be_turned_off() -> None:
    cfg = LoraConfig(target_modules=["q_proj"], exclude_modules=None)
    assert target_names(_model(), cfg) == ["visual.q_proj", "layers.0.q_proj", "layers.1.q_proj"]


def test_a_selection_that_matches_nothing_is_refused_naming_the_field() -> None:
    with pytest.raises(NoTargets, match="matches no linear layer") as err:
        attach_adapters(_model(), LoraConfig(target_modules=["qkv"]), torch.float32)
    assert err.value.field == "actor.lora.target_modules"
    assert classify(err.value).code == ExitCode.CONFIG_ERROR


def test_adapted_model_starts_equal_to_base_and_only_adapters_train() -> None:
    model = _model()
    x = torch.randn(3, 8)
    before = model(x)
    attach_adapters(model, LoraConfig(rank=4, alpha=8.0), torch.bfloat16)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(is_adapter_param(n) for n in trainable)
    assert all(p.dtype == torch.float32 for p in model.parameters() if p.requires_grad)
    assert all(p.dtype == torch.bfloat16 for p in model.parameters() if not p.requires_grad)
    # B = 0 at the start: the base's output (in the base's bf16).
    assert torch.allclose(model(x.bfloat16()).float(), before, atol=0.05)


def test_adapters_off_give_the_base_and_on_give_base_plus_scaled_update() -> None:
    model = _model()
    base = {k: v.clone() for k, v in model.state_dict().items()}
    attach_adapters(model, LoraConfig(rank=4, alpha=8.0), torch.float32)
    _train_adapters(model)
    x = torch.randn(3, 8)
    with adapters_disabled(model):
        off = model(x)
    on = model(x)
    reference = _model()
    reference.load_state_dict(base)
    assert torch.allclose(off, reference(x), atol=1e-6)
    assert not torch.allclose(on, off, atol=1e-3)
    # The merged weights compute what the adapters compute.
    merged = merge_state(model.state_dict(), 8.0 / 4)
    assert not any(is_adapter_param(k) for k in merged)
    reference.load_state_dict(merged)
    assert torch.allclose(reference(x), on, atol=1e-5)


def test_merged_weight_is_base_plus_alpha_over_rank_times_b_a() -> None:
    w, a, b = torch.randn(6, 5), torch.randn(2, 5), torch.randn(6, 2)
    state = {"l.weight": w, "l.bias": torch.zeros(6), "l.lora_A.weight": a, "l.lora_B.weight": b}
    merged = merge_state(state, 3.0)
    assert set(merged) == {"l.weight", "l.bias"}
    assert torch.allclose(merged["l.weight"], w + 3.0 * b @ a)


def test_merge_stream_equals_merge_state_and_survives_reused_buffers() -> None:
    model = _model()
    attach_adapters(model, LoraConfig(rank=4, alpha=8.0), torch.float32)
    _train_adapters(model)
    expected = merge_state(model.state_dict(), 2.0)
    buffer = torch.empty(0)

    def gathered() -> object:
        nonlocal buffer
        for name, p in model.named_parameters():
            buffer = p.detach().clone()  # a buffer the next item overwrites
            yield name, buffer
            buffer.fill_(float("nan"))

    adapted = {"layers.0.q_proj", "layers.0.down_proj", "layers.1.q_proj", "layers.1.down_proj"}
    # Consumed as engines do: each tensor copied before the next is asked for.
    streamed = {
        k: v.clone()
        for k, v in merge_stream(gathered(), adapted, 2.0)  # type: ignore[arg-type]
    }
    assert streamed.keys() == {k for k, _ in _model().named_parameters()}
    for k, v in streamed.items():
        assert torch.allclose(v, expected[k]), k


def test_reset_adapters_is_the_same_on_every_call_and_b_is_zero() -> None:
    one, two = _model(), _model()
    for m in (one, two):
        attach_adapters(m, LoraConfig(rank=4), torch.float32)
        reset_adapters(m, seed=7)
    for (name, p), (_, q) in zip(one.named_parameters(), two.named_parameters(), strict=True):
        assert torch.equal(p, q), name
        if name.endswith("lora_B.weight"):
            assert not p.any()


def test_peft_adapter_directory_uses_peft_names_and_config(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    model = _model()
    lora = LoraConfig(rank=4, alpha=8.0)
    attach_adapters(model, lora, torch.float32)
    adapters = {k: v for k, v in model.state_dict().items() if is_adapter_param(k)}
    out = write_adapter_dir(tmp_path / "adapter", lora, adapters, "/models/base")
    tensors = load_file(str(out / "adapter_model.safetensors"))
    assert "base_model.model.layers.0.q_proj.lora_A.weight" in tensors
    assert tensors["base_model.model.layers.1.down_proj.lora_B.weight"].shape == (8, 4)
    assert len(tensors) == 8
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA"
    assert (config["r"], config["lora_alpha"]) == (4, 8.0)
    assert config["target_modules"] == ["down_proj", "q_proj"]
    assert config["exclude_modules"] == r".*visual.*"
    assert config["base_model_name_or_path"] == "/models/base"


def test_lora_checkpoints_leave_the_frozen_base_out() -> None:
    assert state_dict_options(LoraConfig()).ignore_frozen_params
    assert not state_dict_options(None).ignore_frozen_params


def test_vllm_gets_the_smallest_lora_rank_slot_that_holds_the_adapter() -> None:
    from grpo_trainer.rollout.engine_limits import vllm_lora_rank

    assert [vllm_lora_rank(r) for r in (1, 4, 8, 9, 32, 300, 512)] == [1, 8, 8, 16, 32, 320, 512]
    with pytest.raises(ValueError, match=r"actor\.lora\.rank 1024"):
        vllm_lora_rank(1024)


def test_a_lora_rank_vllm_cannot_serve_is_refused_with_the_config() -> None:
    from grpo_trainer.config import build_config, check_engine_limits
    from grpo_trainer.config_error import ConfigError

    raw = {
        "model": {"path": "org/hub-model"},
        "data": {"train_files": ["t.jsonl"]},
        "rollout": {"engine": "vllm"},
        "actor": {"lora": {"rank": 1024}},
    }
    with pytest.raises(ConfigError) as err:
        check_engine_limits(build_config(raw, environ={}), None)
    assert err.value.field == "actor.lora.rank"
    raw["actor"] = {"lora": {"rank": 64}}
    check_engine_limits(build_config(raw, environ={}), None)
