"""The update's shared-prefix layout (each group's prompt once, responses attending to it)
gives the log-probs and gradients of the plain padded layout: on a real tiny Qwen2, and on
every VLM family the trainer trains (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) with one and with
two images per prompt, through the chunked log-prob head the update runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_testkit.samples import random_samples, text_prompts, vl_prompts
from grpo_trainer.algorithm.grpo_math import log_probs_from_logits
from grpo_trainer.algorithm.lean_logprobs import lean_log_probs
from grpo_trainer.algorithm.packing import can_pack, collate_packed, rope_index_of
from grpo_trainer.algorithm.samples import Sample, TrainBatch, collate_train

pytestmark = pytest.mark.trainer

# Responses of very different lengths, one of a single token (EOS only), and a lone
# sample whose prompt no other sample shares.
LENGTHS = [[5, 1, 17], [9, 30], [4]]


def _forward(model: torch.nn.Module, batch: TrainBatch) -> list[torch.Tensor]:
    model.zero_grad()
    logits = batch.response_logits(model(**batch.model_inputs, use_cache=False).logits)
    logp = log_probs_from_logits(logits, batch.labels)
    (logp * batch.response_mask).sum().backward()
    return batch.gather(logp.detach())


def _samples(prompts: list[Any]) -> list[Sample]:
    return random_samples(prompts, LENGTHS)


@pytest.mark.parametrize("mask_dtype", [None, torch.float32], ids=["bool", "additive"])
def test_packed_groups_match_the_padded_layout(
    tiny_lm: Path, mask_dtype: torch.dtype | None
) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        tiny_lm, dtype=torch.float32, attn_implementation="sdpa"
    )
    prompts, pad_id = text_prompts(tiny_lm)
    samples = _samples(prompts)
    assert rope_index_of(model) is None  # a text model: positions are a count
    assert can_pack(samples, None)
    packed = collate_packed(samples, pad_id, mask_dtype)
    # One row per prompt: each prompt's tokens appear once.
    assert packed.model_inputs["input_ids"].shape[0] == len(prompts)
    plain = collate_train(samples, pad_id)

    lp_plain = _forward(model, plain)
    grads_plain = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    lp_packed = _forward(model, packed)
    grads_packed = [p.grad.clone() for p in model.parameters() if p.grad is not None]

    for a, b, s in zip(lp_packed, lp_plain, samples, strict=True):
        assert a.shape == s.response_ids.shape
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    assert len(grads_packed) == len(grads_plain)
    for a, b in zip(grads_packed, grads_plain, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)
    # Per-token values placed by scatter come back unchanged through gather.
    adv = [torch.full((s.response_ids.numel(),), float(i)) for i, s in enumerate(samples)]
    for a, b in zip(packed.gather(packed.scatter(adv)), adv, strict=True):
        assert torch.equal(a, b)


def _lean(model: torch.nn.Module, batch: TrainBatch, dtype: torch.dtype
          ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor], int]:
    """The update's log-probs (chunked head, entropy as a metric), the gradient of their
    sum over the response tokens, and how many images the vision tower encoded."""
    inputs = {k: v.to(dtype) if v.is_floating_point() else v
              for k, v in batch.model_inputs.items()}
    encoded: list[int] = []
    hook = model.model.visual.register_forward_hook(
        lambda _m, _args, kwargs, _out: encoded.append(len(kwargs["grid_thw"])),
        with_kwargs=True)
    model.zero_grad()
    try:
        out = lean_log_probs(model, inputs, batch, temperature=1.0, chunk=7, entropy=True,
                             entropy_grad=False)
    finally:
        hook.remove()
    (out.logp * batch.response_mask).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return batch.gather(out.logp.detach()), grads, sum(encoded)


def _max_err(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[n].double() - b[n].double()).abs().max()) for n in a)


@pytest.mark.parametrize("images", [1, 2], ids=["one-image", "two-images"])
@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_vlm_groups_packed_with_the_models_rope_match_the_padded_layout(
    tiny_vl_families: dict[str, Path], family: str, images: int
) -> None:
    """float32 on CPU: log-probs within 1e-6 of the padded layout's; every parameter's
    gradient within 1e-5 (observed <= 2.9e-6: the vision tower's and the embeddings'
    gradients are summed over the responses in another order), which is the padded
    path's own distance from float64 (observed 3.0-4.8e-6): the packed gradients are
    no farther from float64's than 1.5x the padded ones (observed <= 1.13x). Each image
    goes through the vision tower once instead of once per response."""
    from transformers import AutoModelForImageTextToText

    model_dir = tiny_vl_families[family]
    prompts, pad = vl_prompts(model_dir, images)
    samples = _samples(prompts)
    results: dict[torch.dtype, tuple[Any, Any]] = {}
    for dtype in (torch.float32, torch.float64):
        model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype,
                                                            attn_implementation="sdpa")
        rope = rope_index_of(model)
        assert rope is not None and can_pack(samples, rope)
        for s in samples:
            s.rope_positions = None
        plain = collate_train(samples, pad)
        packed = collate_packed(samples, pad, dtype, rope)
        width = packed.model_inputs["input_ids"].shape[1]
        assert packed.model_inputs["position_ids"].shape == (3, len(prompts), width)
        results[dtype] = (_lean(model, plain, dtype), _lean(model, packed, dtype))
        tokens = (plain.model_inputs["input_ids"].numel(), len(prompts) * width)

    (lp_plain, g_plain, enc_plain), (lp_packed, g_packed, enc_packed) = results[torch.float32]
    (_, g64, _), _ = results[torch.float64]
    for a, b, s in zip(lp_packed, lp_plain, samples, strict=True):
        assert a.shape == s.response_ids.shape
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert any("visual" in n for n in g_packed)  # the vision tower is in the gradient
    assert _max_err(g_packed, g_plain) <= 1e-5
    assert _max_err(g_packed, g64) <= 1.5 * _max_err(g_plain, g64)
    # The images of the two image prompts, once per prompt, against once per response.
    groups_with_images = [len(ns) for ns in LENGTHS[:2]]
    assert enc_packed == images * len(groups_with_images)
    assert enc_plain == images * sum(groups_with_images)
    assert tokens[1] < tokens[0]
