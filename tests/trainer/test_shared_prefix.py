"""The update's shared-prefix layout (each group's prompt once, responses attending to it)
gives the log-probs and gradients of the plain padded layout, on a real tiny Qwen2."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_trainer.data import Record, load_template
from grpo_trainer.grpo_math import log_probs_from_logits
from grpo_trainer.samples import (
    PromptEncoder,
    Sample,
    TrainBatch,
    can_pack,
    collate_packed,
    collate_train,
)

pytestmark = pytest.mark.trainer


def _forward(model: torch.nn.Module, batch: TrainBatch) -> list[torch.Tensor]:
    model.zero_grad()
    logits = batch.response_logits(model(**batch.model_inputs, use_cache=False).logits)
    logp = log_probs_from_logits(logits, batch.labels)
    (logp * batch.response_mask).sum().backward()
    return batch.gather(logp.detach())


@pytest.mark.parametrize("mask_dtype", [None, torch.float32], ids=["bool", "additive"])
def test_packed_groups_match_the_padded_layout(
    tiny_lm: Path, mask_dtype: torch.dtype | None
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(
        tiny_lm, dtype=torch.float32, attn_implementation="sdpa"
    )
    tok = AutoTokenizer.from_pretrained(tiny_lm)
    enc = PromptEncoder(None, tok, load_template("math"), None)
    # Prompts of different lengths; responses of very different lengths, one of a
    # single token (EOS only), and a lone sample whose prompt no other sample shares.
    prompts = [
        enc.encode(Record(0, "Say the number 7 please", "7")),
        enc.encode(Record(1, "Count to three, slowly and carefully, then stop.", "3")),
        enc.encode(Record(2, "Hi", "1")),
    ]
    gen = torch.Generator().manual_seed(0)
    lengths = [[5, 1, 17], [9, 30], [4]]
    samples = [
        Sample(p, torch.randint(10, 300, (n,), generator=gen), torch.zeros(n), True)
        for p, ns in zip(prompts, lengths, strict=True)
        for n in ns
    ]
    assert can_pack(samples)
    packed = collate_packed(samples, tok.pad_token_id, mask_dtype)
    # One row per prompt: each prompt's tokens appear once.
    assert packed.model_inputs["input_ids"].shape[0] == len(prompts)
    plain = collate_train(samples, tok.pad_token_id)

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
