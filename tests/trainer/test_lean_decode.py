"""The CPU engine's lean decode step computes the model's own forward for Qwen2, Qwen3
and Llama (random tiny models in memory), and the engine keeps using it after its
first-step check."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from grpo_trainer.algorithm.samples import EncodedPrompt
from grpo_trainer.rollout.base import SamplingSpec
from grpo_trainer.rollout.hf import HFGenerateEngine, _GrowingLayer
from grpo_trainer.rollout.lean_decode import LeanDecoder, supports

pytestmark = pytest.mark.trainer

DIMS = {
    "vocab_size": 300,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}


def _model(kind: str) -> Any:
    import transformers as tf

    config_cls, model_cls = {
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),  # per-head q/k norms
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),  # no q/k/v bias
    }[kind]
    torch.manual_seed(0)
    cfg = config_cls(**DIMS, attn_implementation="sdpa")
    return model_cls(cfg).eval()


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
def test_lean_step_is_the_models_forward(kind: str) -> None:
    from transformers import DynamicCache

    model = _model(kind)
    assert supports(model)
    lean = LeanDecoder(model)  # fuses projections in place: the model must be unchanged
    b, width, new = 3, 7, 5
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 300, (b, width), generator=gen)
    mask = torch.ones(b, width, dtype=torch.long)
    mask[0, :3] = 0  # a left-padded row
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        ref_cache, our_cache = DynamicCache(config=model.config), DynamicCache(config=model.config)
        model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=ref_cache)
        model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=our_cache)
        layers = [_GrowingLayer(layer, 1, width + new) for layer in our_cache.layers]
        attend = torch.ones(b, 1, 1, width + new, dtype=torch.bool)
        attend[:, 0, 0, :width] = mask.bool()
        ref_mask = torch.cat([mask, torch.ones(b, new, dtype=torch.long)], dim=1)
        for t in range(new):
            tok = torch.randint(5, 300, (b,), generator=gen)
            p = pos[:, -1:] + 1 + t
            ours = lean.step(tok, p, layers, attend[..., : width + t + 1])
            ref = model(
                input_ids=tok[:, None],
                attention_mask=ref_mask[:, : width + t + 1],
                position_ids=p,
                past_key_values=ref_cache,
            ).logits[:, -1]
            torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_engine_keeps_the_lean_step_after_its_check() -> None:
    model = _model("qwen2")
    engine = HFGenerateEngine(model, pad_id=0, eos_ids=[1])
    assert engine.lean is not None
    prompts = [EncodedPrompt(record=None, input_ids=torch.arange(5, 5 + n)) for n in (4, 6)]  # type: ignore[arg-type]
    spec = SamplingSpec(n=2, temperature=1.0, top_p=1.0, max_new_tokens=6, seed=3)
    engine.generate(prompts, spec)
    assert engine._lean_checked and engine.lean is not None


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_vlm_rollouts_decode_the_same_with_the_lean_step(
    tiny_vl_families: dict[str, Any], family: str
) -> None:
    """A VLM's decode steps are text: the lean step (its language model's layers, the
    rotary table at the text position plus the prompt's M-RoPE offset) samples the same
    tokens with the same log-probs as the model's own forward, after image prompts of
    two sizes left-padded together; the engine keeps it after its first-step check."""
    from transformers import AutoModelForImageTextToText, AutoProcessor, AutoTokenizer

    from grpo_testkit.datasets import png
    from grpo_trainer.algorithm.samples import PromptEncoder
    from grpo_trainer.data import Record, load_template

    path = tiny_vl_families[family]
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32,
                                                        attn_implementation="sdpa")
    assert supports(model)
    tok = AutoTokenizer.from_pretrained(path)
    enc = PromptEncoder(AutoProcessor.from_pretrained(path), tok, load_template("r1v"), None)
    prompts = [enc.encode(Record(0, "<image>How many?", "3", [png((200, 30, 30), (44, 36))])),
               enc.encode(Record(1, "<image>Count the shapes, slowly and carefully.", "2",
                                 [png((0, 90, 30), (64, 60))]))]
    spec = SamplingSpec(n=3, temperature=1.0, top_p=1.0, max_new_tokens=8, seed=5)
    engine = HFGenerateEngine(model, pad_id=int(tok.pad_token_id), eos_ids=[-1])
    assert engine.lean is not None
    lean = engine.generate(prompts, spec)
    assert engine._lean_checked and engine.lean is not None  # kept after its check
    engine.lean = None  # the model's own forward for every step
    plain = engine.generate(prompts, spec)
    for a, b in zip((g for gs in lean for g in gs), (g for gs in plain for g in gs), strict=True):
        assert torch.equal(a.token_ids, b.token_ids)
        torch.testing.assert_close(a.log_probs, b.log_probs, atol=1e-5, rtol=1e-5)
