"""The shared-prefix layout's width is a multiple of 8 tokens (grpo_api.contract
``packed_width``), in the collation, the micro-batch layout and the planner alike, and
its 4-D mask is made on the rank's device from the segment ids.

Why 8: SDPA's memory-efficient kernel, the one chosen on GPUs once a mask is given,
copies a mask whose strides but the last are not multiples of 8 elements into a padded
tensor (ATen attention.cpp ``preprocess_mask``: ``mem_eff_alignment = 8``,
``aligned_tensor``, ``pad_bias``) in every layer, and keeps that copy for backward. The
C++ is not installed; torch/_inductor/lowering.py ``sdpa_constraint`` restates the rule
(``ALIGNMENT = 8``, "found in ... attention.cpp preprocess_mask"), which the first test
reads. A CPU never pads, so these tests check the shapes and strides the kernel checks.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from grpo_api.contract import PACKED_WIDTH_ALIGNMENT, packed_width
from grpo_api.job import parse_spec
from grpo_api.job.spec import GRPOJobSpec
from grpo_operator.planner import plan_memory
from grpo_operator.planner.layout import micro_batch, token_budgets
from grpo_trainer.algorithm.lean_logprobs import full_logits_log_probs
from grpo_trainer.algorithm.micro_batches import layout_tokens
from grpo_trainer.algorithm.packing import collate_packed, packed_mask, row_tokens, runs
from grpo_trainer.algorithm.samples import EncodedPrompt, Sample, TrainBatch
from grpo_trainer.data import Record

pytestmark = pytest.mark.unit

V = 300
PAD = 0
# The packed and the unpadded forward's log-probs in float32 (the pad keys take no
# weight: exp(finfo.min) is 0): equal but for the matmuls' summation order.
LOGP_ATOL = 1e-5


def _groups(shape: list[tuple[int, list[int]]], seed: int = 0) -> list[Sample]:
    """Samples of groups (prompt tokens, [response tokens, ...]), random token ids; the
    samples of a group share their encoded prompt, as a rollout leaves them."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, (p, responses) in enumerate(shape):
        prompt = EncodedPrompt(Record(i, "q", "a"), torch.randint(10, V, (p,), generator=gen))
        out += [Sample(prompt, torch.randint(10, V, (r,), generator=gen), torch.zeros(r), True)
                for r in responses]
    return out


def test_the_alignment_is_the_one_atens_attention_reads() -> None:
    source = Path(torch.__file__).parent / "_inductor" / "lowering.py"
    text = source.read_text()
    rule = re.search(r"attention\.cpp preprocess_mask\s*\n\s*ALIGNMENT = (\d+)", text)
    assert rule is not None, f"{source}: sdpa_constraint's ALIGNMENT moved; read it again"
    assert int(rule.group(1)) == PACKED_WIDTH_ALIGNMENT


@pytest.mark.parametrize("tokens", range(9, 18))
def test_every_width_gives_an_aligned_mask_whose_pad_columns_no_token_sees(
    tokens: int,
) -> None:
    samples = _groups([(4, [tokens - 6, 2]), (3, [2])])  # rows of `tokens` and 5
    batch = collate_packed(samples, PAD, torch.bfloat16)
    mask = batch.model_inputs["attention_mask"]
    width = mask.shape[-1]
    assert width % PACKED_WIDTH_ALIGNMENT == 0 and 0 <= width - tokens < PACKED_WIDTH_ALIGNMENT
    # ATen's aligned_tensor: every stride but the last a multiple of 8, the last 1.
    assert all(s % PACKED_WIDTH_ALIGNMENT == 0 for s in mask.stride()[:-1])
    assert mask.stride(-1) == 1
    # The keys are as wide as the mask (transformers' sdpa slices it to the keys).
    assert batch.model_inputs["input_ids"].shape[1] == width
    floor = torch.finfo(torch.bfloat16).min
    for row, run in enumerate(runs(samples)):
        real = row_tokens(run)
        assert bool((mask[row, 0, :real, real:] == floor).all())  # pads: never attended
        assert bool((batch.model_inputs["input_ids"][row, real:] == PAD).all())
    # The micro-batch layout counts the rows as the collation pads them.
    assert layout_tokens(samples, packed=True) == batch.model_inputs["input_ids"].numel()


def _host_mask(seg: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """The mask as collate_packed made it on the host before (the reference)."""
    idx = torch.arange(seg.shape[1])
    causal = idx[None, :] <= idx[:, None]
    same = seg[:, :, None] == seg[:, None, :]
    mask = (causal[None] & (same | (seg == 0)[:, None, :]))[:, None]
    if dtype is None:
        return mask
    return torch.zeros(mask.shape, dtype=dtype).masked_fill(~mask, torch.finfo(dtype).min)


LAYOUTS = [
    [(5, [3, 4, 1])],
    [(4, [1]), (7, [2, 2]), (2, [9])],
    [(12, [3, 3, 3, 3]), (1, [1])],
    [(6, [0, 5])],
]


@pytest.mark.parametrize("shape", LAYOUTS)
@pytest.mark.parametrize("dtype", [None, torch.bfloat16, torch.float32])
def test_the_mask_made_from_segment_ids_is_the_host_built_one(
    shape: list[tuple[int, list[int]]], dtype: torch.dtype | None,
) -> None:
    """Exactly (booleans and a fill, no arithmetic), for every layout and dtype."""
    samples = _groups(shape)
    rows = runs(samples)
    width = packed_width(max(row_tokens(r) for r in rows))
    seg = torch.full((len(rows), width), -1, dtype=torch.int32)
    for row, run in enumerate(rows):
        seg[row, : run[0].prompt.input_ids.numel()] = 0
        col = run[0].prompt.input_ids.numel()
        for k, s in enumerate(run, start=1):
            seg[row, col : col + s.response_ids.numel()] = k
            col += s.response_ids.numel()
    made = collate_packed(samples, PAD, dtype).model_inputs["attention_mask"]
    assert torch.equal(made, _host_mask(seg, dtype))
    assert torch.equal(packed_mask(seg, dtype, "cpu"), made)


def test_the_mask_is_made_on_the_given_device_and_the_rest_stays_on_the_host() -> None:
    batch = collate_packed(_groups(LAYOUTS[1]), PAD, torch.bfloat16, device="meta")
    assert batch.model_inputs["attention_mask"].device.type == "meta"
    assert batch.model_inputs["input_ids"].device.type == "cpu"


def _unpadded(batch: TrainBatch, width: int) -> TrainBatch:
    """``batch`` cut back to ``width`` columns (the widest row unrounded), the logit
    positions mapped to the narrower rows: the layout before the rounding."""
    inputs = dict(batch.model_inputs)
    padded = inputs["input_ids"].shape[1]
    inputs["input_ids"] = inputs["input_ids"][:, :width]
    inputs["position_ids"] = inputs["position_ids"][..., :width]
    inputs["attention_mask"] = inputs["attention_mask"][..., :width, :width].contiguous()
    assert batch.logit_index is not None
    index = batch.logit_index // padded * width + batch.logit_index % padded
    return TrainBatch(inputs, batch.labels, batch.response_mask, batch.positions, index)


def test_the_padding_leaves_the_log_probs_of_a_packed_batch_unchanged() -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    model = Qwen2ForCausalLM(cfg).eval()
    assert model.config._attn_implementation == "sdpa"  # the trainer's, which takes the mask
    samples = _groups([(7, [3, 2, 1]), (5, [4])], seed=1)  # rows of 13 and 9 tokens
    batch = collate_packed(samples, PAD, torch.float32)
    widest = max(row_tokens(r) for r in runs(samples))
    assert batch.model_inputs["input_ids"].shape[1] == 16 > widest == 13
    with torch.no_grad():
        padded = full_logits_log_probs(model, batch.model_inputs, batch, temperature=1.0,
                                       entropy=True, entropy_grad=False)
        narrow = _unpadded(batch, widest)
        plain = full_logits_log_probs(model, narrow.model_inputs, narrow, temperature=1.0,
                                      entropy=True, entropy_grad=False)
    torch.testing.assert_close(padded.logp, plain.logp, rtol=0, atol=LOGP_ATOL)
    assert padded.entropy is not None and plain.entropy is not None
    torch.testing.assert_close(padded.entropy, plain.entropy, rtol=0, atol=LOGP_ATOL)


def _spec(prompt: int, **memory: int) -> GRPOJobSpec:
    return parse_spec({
        "model": {"path": "Qwen/Qwen2.5-VL-7B-Instruct"},
        "data": {"train": "hiyouga/geometry3k@train", "maxPromptLength": prompt,
                 "maxResponseLength": 2048, "maxPixels": 4194304},
        "algorithm": {"rolloutN": 5, "klCoef": 0.01},
        "training": {"rolloutBatchSize": 512, "globalBatchSize": 128},
        "resources": {"gpuType": "H100-80GB", "nodes": 1, "gpusPerNode": 8},
        "checkpoint": {"size": "1Ti"},
        "memory": memory,
    })


def test_the_planner_counts_the_rows_rounded_and_says_so() -> None:
    """A prompt of 2045 tokens: no row width is a multiple of 8 before rounding."""
    p, r = 2045, 2048
    by_samples = plan_memory(_spec(p, microBatchSize=4))
    mb = micro_batch(by_samples.geometry, by_samples.settings)
    # 4 samples span at most 2 groups: one row of p + 4r, or two of p + 3r.
    one, two = packed_width(p + 4 * r), packed_width(p + 3 * r)
    assert (one, two) == (p + 4 * r + 3, p + 3 * r + 3)
    assert mb.tokens == max(one, 2 * two)
    assert mb.mask_elements == max(one**2, 2 * two**2)
    by_tokens = plan_memory(_spec(p))
    assert token_budgets(by_tokens.geometry, 5)[-1] == packed_width(p + r)
    reason = next(d for d in by_tokens.decisions if d.knob == "microBatchTokens").reason
    assert f"rows padded to a multiple of {PACKED_WIDTH_ALIGNMENT} tokens" in reason


@pytest.mark.parametrize("longest", range(9, 18))
def test_the_segment_layouts_mask_is_aligned_and_allows_what_the_dense_one_does(
    longest: int,
) -> None:
    """The responses' mask by segment (model/segment_attention.py) has the same
    alignment as the dense one (its keys ``packed_width(P_max + R_max)``), and a response
    slot's query may attend exactly the keys its token may under the dense mask."""
    samples = _groups([(4, [longest, 12, 1, 9, 11, 10, 12, 8]), (7, [12, 5, 9])])
    segments = collate_packed(samples, PAD, torch.bfloat16, segments=True)
    layout = segments.model_inputs["segment_layout"]
    dense = collate_packed(samples, PAD, None).model_inputs["attention_mask"][:, 0]
    flat = dense.reshape(-1, dense.shape[-1])  # [rows * W, W]: a query's allowed keys
    width = dense.shape[-1]
    # A group holds the lengths more than half its longest: 5 and 1 never share one.
    assert len(layout.groups) >= 3
    seen = 0
    counts = [g.slots.numel() for g in layout.groups]
    for g, queries in zip(layout.groups, layout.queries.split(counts), strict=True):
        mask = g.mask
        real = torch.bincount(g.slots // mask.shape[2], minlength=mask.shape[0])
        assert int(real.max()) == mask.shape[2] and bool((2 * real > mask.shape[2]).all())
        assert mask.shape[-1] == packed_width(7 + mask.shape[2])
        assert all(s % PACKED_WIDTH_ALIGNMENT == 0 for s in mask.stride()[:-1])
        allowed = mask[:, 0] == 0  # [N, R, S]
        for n in range(mask.shape[0]):
            for i in range(mask.shape[2]):
                q = int(g.slot_query[n, i])
                if q not in queries[g.slots == n * mask.shape[2] + i]:
                    continue  # a padded slot: its result is dropped
                seen += 1
                keys = {int(k) % width for k in g.slot_keys[n][allowed[n, i]]}
                assert keys == set(flat[q].nonzero().flatten().tolist()), (n, i)
    assert seen == sum(s.response_ids.numel() for s in samples)
