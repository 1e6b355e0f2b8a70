"""The packed update's attention by segment (grpo_trainer.model.segment_attention) gives
the dense mask's log-probs and gradients: on a tiny Qwen2 with grouped KV heads and on
every VLM family the trainer trains, through the chunked log-prob head the update runs,
with rows whose prompts differ in length and responses of 0 to 30 tokens. A micro-batch
where the segments would take more memory than the dense mask keeps the dense mask."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_api.contract import dense_mask_bytes, segment_layout_bytes
from grpo_testkit.samples import random_samples, text_prompts, vl_prompts
from grpo_trainer.algorithm.lean_logprobs import lean_log_probs
from grpo_trainer.algorithm.packing import collate_packed, rope_index_of
from grpo_trainer.algorithm.samples import EncodedPrompt, Sample, TrainBatch
from grpo_trainer.data import Record
from grpo_trainer.model import segment_attention
from grpo_trainer.model.segment_attention import length_slots

pytestmark = pytest.mark.trainer

# Per prompt: responses of very different lengths, one empty (no queries at all), one of
# a single token, and a lone sample whose prompt no other sample shares.
LENGTHS = [[5, 1, 17, 0], [9, 30], [4]]


def _samples(prompts: list[Any]) -> list[Sample]:
    return random_samples(prompts, LENGTHS)


def _update(model: torch.nn.Module, batch: TrainBatch) -> tuple[list[torch.Tensor],
                                                                  dict[str, torch.Tensor]]:
    """The update's log-probs (chunked head) and the gradient of their sum."""
    model.zero_grad()
    out = lean_log_probs(model, batch.model_inputs, batch, temperature=1.0, chunk=7,
                         entropy=True, entropy_grad=False)
    (out.logp * batch.response_mask).sum().backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return batch.gather(out.logp.detach()), grads


def _compare(model: torch.nn.Module, samples: list[Sample], pad_id: int,
             rope: Any = None) -> tuple[TrainBatch, TrainBatch]:
    dense = collate_packed(samples, pad_id, torch.float32, rope)
    lp_dense, g_dense = _update(model, dense)
    assert segment_attention.install(model) and segment_attention.installed(model)
    segments = collate_packed(samples, pad_id, torch.float32, rope, segments=True)
    lp_seg, g_seg = _update(model, segments)
    for a, b in zip(lp_seg, lp_dense, strict=True):
        torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)
    assert g_seg.keys() == g_dense.keys()
    for name in g_dense:
        torch.testing.assert_close(g_seg[name], g_dense[name], atol=1e-5, rtol=1e-4,
                                   msg=lambda m, n=name: f"{n}: {m}")
    return dense, segments


def test_segments_match_the_dense_mask_on_a_grouped_kv_text_model(tiny_lm: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    cfg = model.config
    assert cfg.num_key_value_heads < cfg.num_attention_heads  # GQA: the KV heads repeat
    prompts, pad_id = text_prompts(tiny_lm)
    dense, segments = _compare(model, _samples(prompts), pad_id)
    layout = segments.model_inputs["segment_layout"]
    # The segment ids travel as the model's 4-D mask (integers: SDPA would refuse them).
    assert segments.model_inputs["attention_mask"].dtype == torch.int32
    # What the update holds for attention, as the contract (and the planner) counts it.
    rows, width = dense.model_inputs["input_ids"].shape
    lengths = [n for ns in LENGTHS for n in ns if n]
    # Lengths more than half their group's longest share it (length_buckets).
    assert length_slots(lengths) == [(2, 30), (2, 9), (1, 4), (1, 1)]
    expected = segment_layout_bytes(rows * width, length_slots(lengths), sum(lengths),
                                    max(p.input_ids.numel() for p in prompts), 4)
    held = layout.nbytes + segments.model_inputs["attention_mask"].nbytes
    assert held == expected
    assert dense.model_inputs["attention_mask"].nbytes == dense_mask_bytes(rows, width, 4)
    assert held < 0.45 * dense_mask_bytes(rows, width, 4)
    # A forward without a layout (the padded collation, the hf engine) is plain sdpa.
    ids = prompts[0].input_ids[None]
    plain = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=ids).logits, plain(input_ids=ids).logits)


@pytest.mark.parametrize("family", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_segments_match_the_dense_mask_on_every_vl_family(
    tiny_vl_families: dict[str, Path], family: str
) -> None:
    from transformers import AutoModelForImageTextToText

    path = tiny_vl_families[family]
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32,
                                                        attn_implementation="sdpa")
    prompts, pad_id = vl_prompts(path, 2)
    _compare(model, _samples(prompts), pad_id, rope_index_of(model))
    # The vision tower keeps its own attention (it receives the forward's keywords too).
    vision = model.config.vision_config
    assert vision._attn_implementation == "sdpa"


def test_one_long_response_beside_many_short_ones_takes_a_slot_group_of_its_own() -> None:
    """Slots are as long as their group's longest response: one of 64 tokens beside 60
    of one token would pad 60 slots to 64 in one group, more than the dense mask; grouped
    by length it takes one slot of 64 and 60 of one, a fraction of either."""
    prompt = EncodedPrompt(Record(0, "", "", []), torch.arange(5, 13))
    samples = [Sample(prompt, torch.arange(20, 20 + n), torch.zeros(n), True)
               for n in [64] + [1] * 60]
    batch = collate_packed(samples, 0, torch.float32, segments=True)
    layout = batch.model_inputs["segment_layout"]
    assert [tuple(g.slot_query.shape) for g in layout.groups] == [(1, 64), (60, 1)]
    width = batch.model_inputs["input_ids"].shape[1]
    held = layout.nbytes + batch.model_inputs["attention_mask"].nbytes
    one_group = segment_layout_bytes(width, [(61, 64)], 124, 8, 4)
    assert held < 0.5 * dense_mask_bytes(1, width, 4) < one_group
    # A row too small for the gathers to pay keeps the dense mask.
    tiny = EncodedPrompt(Record(1, "", "", []), torch.arange(5, 7))
    small = [Sample(tiny, torch.arange(20, 20 + n), torch.zeros(n), True) for n in (3, 1)]
    kept = collate_packed(small, 0, torch.float32, segments=True).model_inputs
    assert "segment_layout" not in kept and kept["attention_mask"].dtype == torch.float32


def test_an_eager_model_keeps_the_dense_mask(tiny_lm: Path) -> None:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.float32,
                                                 attn_implementation="eager")
    assert not segment_attention.install(model)
    assert not segment_attention.installed(model)


def test_the_layout_reaches_the_layers_through_gradient_checkpointing(tiny_lm: Path) -> None:
    """With gradient checkpointing (as modeling._prepare enables it) each layer's
    recompute gets the forward's keywords again: the same log-probs and gradients as
    without, by segment (plain sdpa would refuse the integer segment ids)."""
    from transformers import AutoModelForCausalLM

    prompts, pad_id = text_prompts(tiny_lm)
    samples = _samples(prompts)
    found = []
    for checkpointing in (False, True):
        model = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.float32,
                                                     attn_implementation="sdpa")
        assert segment_attention.install(model)
        model.train()
        if checkpointing:
            model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs={"use_reentrant": False})
        batch = collate_packed(samples, pad_id, torch.float32, segments=True)
        assert "segment_layout" in batch.model_inputs
        found.append(_update(model, batch))
    (lp_plain, g_plain), (lp_ckpt, g_ckpt) = found
    for a, b in zip(lp_ckpt, lp_plain, strict=True):
        torch.testing.assert_close(a, b, atol=0.0, rtol=0.0)
    for name in g_plain:
        torch.testing.assert_close(g_ckpt[name], g_plain[name], atol=1e-7, rtol=1e-6)
