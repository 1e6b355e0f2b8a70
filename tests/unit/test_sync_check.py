"""The weight sync's names and shapes against the checkpoint vLLM loaded, checked at
start-up (rollout/sync_check.py): real tiny models written by transformers 5 itself."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from grpo_trainer.config_error import ConfigError
from grpo_trainer.rollout.sync_check import Expected, check_weight_sync, sync_problems

pytestmark = pytest.mark.unit


def saved(model: torch.nn.Module, path: Path) -> str:
    model.save_pretrained(path)
    return str(path)


def tiny_qwen3_vl_moe() -> torch.nn.Module:
    from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration

    text = dict(hidden_size=64, intermediate_size=96, moe_intermediate_size=48,
                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                num_experts=4, num_experts_per_tok=2, vocab_size=256, decoder_sparse_step=1,
                rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]})
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  deepstack_visual_indexes=[0])
    return Qwen3VLMoeForConditionalGeneration(
        Qwen3VLMoeConfig(text_config=text, vision_config=vision))


def tiny_qwen2_5_vl() -> torch.nn.Module:
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    text = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=1, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=256,
                rope_scaling={"rope_type": "default", "mrope_section": [2, 3, 3]})
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    return Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text,
                                                                vision_config=vision))


def hub_layout(model: torch.nn.Module, path: Path) -> str:
    """The checkpoint as Qwen's hub repos hold Qwen2.5-VL: ``model.layers.*`` and
    ``visual.*``, which transformers 5 renames on load (its own save_pretrained writes
    its names)."""
    from safetensors.torch import save_file

    model.config.save_pretrained(path)
    renamed = {k.replace("model.language_model.", "model.").replace("model.visual.", "visual."):
               v.contiguous() for k, v in model.state_dict().items()}
    save_file(renamed, str(path / "model.safetensors"))
    return str(path)


@pytest.fixture
def one_rank_world() -> Iterator[None]:
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", 0, 1, is_master=True),
                            rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_a_renamed_checkpoint_passes_on_the_sharded_actor(
        tmp_path: Path, one_rank_world: None) -> None:
    """Qwen2.5-VL: transformers only renames its keys (model.layers -> model.language_model
    .layers), which vLLM's loader maps too; checked on the actor as the rank holds it,
    FSDP2-sharded (whose root class transformers does not know by name)."""
    from grpo_api.trainer_config import ActorConfig
    from grpo_trainer.model.modeling import shard_model

    model = tiny_qwen2_5_vl()
    hub = hub_layout(model, tmp_path)
    check_weight_sync(model, hub)
    shard_model(model, ActorConfig(dtype="float32"), torch.device("cpu"), trainable=True)
    check_weight_sync(model, hub)


def test_qwen3_vl_moe_experts_are_refused_with_the_conversion_named(tmp_path: Path) -> None:
    """transformers 5 transposes the fused experts on load: the sync would send them in
    its layout under checkpoint names; the rank fails at start-up instead."""
    model = tiny_qwen3_vl_moe()
    with pytest.raises(ConfigError) as err:
        check_weight_sync(model, saved(model, tmp_path))
    text = str(err.value)
    assert "rollout.engine" in text and "2 of" in text
    assert "model.language_model.layers.0.mlp.experts.gate_up_proj" in text
    assert "Transpose" in text and "rollout.engine: hf" in text


def test_a_missing_name_or_another_shape_is_a_problem() -> None:
    expected = {"a": Expected("a", (2, 3)), "b": Expected("model.b", (4,))}
    assert sync_problems([("a", (2, 3)), ("b", (4,))], expected) == []
    problems = sync_problems([("a", (3, 2)), ("c", (1,))], expected)
    assert problems == ["a: shape [3, 2], the checkpoint's a is [2, 3]",
                        "c [1]: no checkpoint tensor is renamed to it"]


def test_a_moe_vlm_with_vllm_is_refused_at_apply(tmp_path: Path) -> None:
    """What the start-up check would refuse, admission refuses first: the planner reads
    the experts from config.json (transformers' own, here). hf, or LoRA, is admitted."""
    import yaml

    from grpo_api.job import SpecError, parse_spec
    from grpo_operator.reconcile.planning import checked_plan

    config = tiny_qwen3_vl_moe().config.to_dict()
    config["architectures"] = ["Qwen3VLMoeForConditionalGeneration"]
    root = Path(__file__).resolve().parents[2]
    spec = yaml.safe_load((root / "examples/grpojob-qwen25vl-7b-a100-40gb.yaml").read_text())[
        "spec"]
    with pytest.raises(SpecError) as err:
        checked_plan(parse_spec(spec), model_config=config, model_source="test")
    assert "spec.rollout.engine: vllm cannot take this MoE model's weights" in str(err.value)
    checked_plan(parse_spec({**spec, "rollout": {**spec.get("rollout", {}), "engine": "hf"}}),
                 model_config=config, model_source="test")
