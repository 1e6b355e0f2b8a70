"""The chunked log-prob head on the real tiny models gives the full logits' log-probs and
gradients: Qwen2 in the padded and the shared-prefix packed layouts, Qwen2.5-VL with
images, with LoRA adapters, and under FSDP2 on 2 ranks (the actor, whose root stays
gathered for backward, and a reference, whose root is resharded after its forward).

Tolerances (observed in brackets): float32 log-probs within 1e-6 [equal to the bit but
for a chunk's rounding]; float32 gradients of the model's parameters within 1e-5 of the
larger of 1 and their largest entry [1.4e-6; the plain path itself is 3.8e-6 off the
float64 gradient, and the chunked head's gradient is as close to float64 as the plain
path's, which the Qwen2.5-VL test checks]; the head's own gradients (hidden states, LM
head) within 1e-6 (tests/unit/test_lean_logprobs.py). bf16: log-probs within 1e-6,
gradients within 2^-6 of that scale [bf16 roundings of the logits' gradient and of
the LM head's gradient per chunk]."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_testkit.dist import run_ranks
from grpo_testkit.lean_check import fsdp_rank, run, samples
from grpo_trainer.algorithm.packing import collate_packed
from grpo_trainer.algorithm.samples import TrainBatch, collate_train

pytestmark = pytest.mark.trainer


GRAD_TOL = {torch.float32: 1e-5, torch.bfloat16: 2**-6}


def _scale(g: torch.Tensor) -> float:
    return max(1.0, float(g.abs().max()))


def _compare(model: torch.nn.Module, batch: TrainBatch, dtype: torch.dtype
             ) -> dict[str, torch.Tensor]:
    """Log-probs within 1e-6; each parameter's gradient within the dtype's tolerance of
    the larger of 1 and its largest entry. Returns the chunked head's gradients."""
    lean_lp, lean_g = run(model, batch, lean=True)
    full_lp, full_g = run(model, batch, lean=False)
    for a, b in zip(lean_lp, full_lp, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    assert lean_g.keys() == full_g.keys() and lean_g
    for name, g in full_g.items():
        err = (lean_g[name].float() - g.float()).abs().max()
        assert err <= GRAD_TOL[dtype] * _scale(g.float()), (name, float(err))
    return lean_g


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_qwen2_matches_the_full_logits(tiny_lm: Path, dtype: torch.dtype, layout: str) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=dtype)
    items, pad = samples(tiny_lm, vision=False)
    batch = (collate_train(items, pad) if layout == "padded"
             else collate_packed(items, pad, dtype))
    _compare(model, batch, dtype)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_qwen25_vl_with_images_matches_the_full_logits(tiny_vlm: Path, lora: bool) -> None:
    from transformers import AutoModelForImageTextToText

    from grpo_api.trainer_config import LoraConfig
    from grpo_trainer.lora import attach_adapters, reset_adapters

    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm, dtype=torch.float32)
    if lora:  # B nonzero, so the adapters change the log-probs and get gradients
        attach_adapters(model, LoraConfig(rank=4), torch.float32)
        reset_adapters(model, 0)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith("lora_B.weight"):
                    p.normal_(0, 0.1, generator=torch.Generator().manual_seed(len(name)))
    items, pad = samples(tiny_vlm, vision=True)
    batch = collate_train(items, pad)
    assert "pixel_values" in batch.model_inputs
    lean = _compare(model, batch, torch.float32)
    # As close to the float64 gradient as the plain path is, to float32's resolution.
    _, full = run(model, batch, lean=False)
    batch.model_inputs["pixel_values"] = batch.model_inputs["pixel_values"].double()
    _, exact = run(model.double(), batch, lean=False)
    for name, g in exact.items():
        lean_err = (lean[name].double() - g).abs().max() / _scale(g)
        full_err = (full[name].double() - g).abs().max() / _scale(g)
        assert lean_err <= full_err + 1e-6, (name, float(lean_err), float(full_err))


def test_under_fsdp2_the_actor_and_the_reference_match_the_full_logits(tiny_vlm: Path) -> None:
    for r in run_ranks(fsdp_rank, 2, {"model": str(tiny_vlm)}, timeout_s=600):
        lean, full = r["lean"], r["full"]
        for key in ("logp", "ref"):
            for a, b in zip(lean[key], full[key], strict=True):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
        assert lean["grads"].keys() == full["grads"].keys() and lean["grads"]
        for name, g in full["grads"].items():
            assert float((lean["grads"][name] - g).abs().max()) <= 1e-6, name
