"""The planner plans the update's micro-batches by tokens (planner/layout.py): the largest
budget that fits, with its reasons; the activation, logits and attention-mask terms from
the budget; the trainer config and status carry it; the CudaOOM ladder halves it. A spec
that pins microBatchSize keeps micro-batches by samples, planned in the shared-prefix
layout at their longest."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from grpo_api.contract import FailureReason
from grpo_api.job import SpecError, parse_spec
from grpo_operator.planner import plan_memory
from grpo_operator.planner.budget import GIB
from grpo_operator.planner.ladder import next_safer_plan
from grpo_operator.planner.layout import image_tokens, micro_batch, token_budgets
from grpo_operator.planner.report import plan_status
from grpo_operator.planner.sizes import (
    activation_bytes_per_token,
    logprob_bytes,
    vision_activation_bytes,
)
from grpo_operator.planner.stage_terms import compute_budget
from grpo_operator.render.names import JobRef
from grpo_operator.render.trainer_config import trainer_config

pytestmark = pytest.mark.unit

PROMPT, RESPONSE, N = 2048, 2048, 5  # EasyR1's geometry


def _spec(size: str = "7B", gpus: int = 8, prompt: int = PROMPT, **memory: Any) -> Any:
    return parse_spec({
        "model": {"path": f"Qwen/Qwen2.5-VL-{size}-Instruct"},
        "data": {"train": "hiyouga/geometry3k@train", "maxPromptLength": prompt,
                 "maxResponseLength": RESPONSE, "maxPixels": 4194304},
        "algorithm": {"rolloutN": N, "klCoef": 0.01},
        "training": {"rolloutBatchSize": 512, "globalBatchSize": 128},
        "resources": {"gpuType": "H100-80GB", "nodes": max(1, gpus // 8),
                      "gpusPerNode": min(gpus, 8)},
        "checkpoint": {"size": "1Ti"},
        "memory": memory,
    })


def test_the_plan_goes_by_tokens_and_the_trainer_and_status_get_the_budget() -> None:
    spec = _spec()
    plan = plan_memory(spec)
    tokens = plan.settings.micro_batch_tokens
    # 16 samples per rank touch at most 4 groups of 5: 4 rows of 2048 + 5 x 2048.
    assert token_budgets(plan.geometry, N)[0] == 4 * (PROMPT + N * RESPONSE) == tokens
    assert trainer_config(spec, plan, JobRef("j", "ns", "u"))["actor"][
        "micro_batch_tokens"] == tokens
    assert plan_status(plan).to_wire()["microBatchTokens"] == tokens
    reason = next(d for d in plan.decisions if d.knob == "microBatchTokens")
    assert reason.source == "auto" and "whole mini-batch" in reason.reason


def test_the_largest_budget_that_fits_is_chosen_and_the_one_above_named() -> None:
    """Qwen2.5-VL-32B on 8 H100s cannot take its whole mini-batch at once: the plan takes
    the largest halving that fits, and says what the one above would peak at."""
    plan = plan_memory(_spec("32B", 16))
    geo, st, b = plan.geometry, plan.settings, plan.budget
    budgets = token_budgets(geo, N)
    assert st.micro_batch_tokens in budgets and st.micro_batch_tokens < budgets[0]
    above = budgets[budgets.index(st.micro_batch_tokens) - 1]
    bigger = compute_budget(geo, replace(st, micro_batch_tokens=above))
    assert not bigger.fits and b.fits
    reason = next(d for d in plan.decisions if d.knob == "microBatchTokens").reason
    assert f"the largest budget that fits: {above} tokens would peak at" in reason


def test_the_activation_logits_and_mask_terms_come_from_the_budget() -> None:
    plan = plan_memory(_spec(microBatchTokens=20_000))
    geo, st = plan.geometry, plan.settings
    train = plan.budget.gpu_stages["training"]
    assert st.micro_batch_tokens == 20_000 and "micro_batch_tokens" in plan.pinned
    mb = micro_batch(geo, st)
    # Rows hold a prompt with its image (at maxPixels, within the prompt) and a response
    # token; at most the 4 groups of the rank's mini-batch.
    assert image_tokens(geo) == PROMPT and mb.images == min(4, 20_000 // (PROMPT + 1))
    act = (20_000 * activation_bytes_per_token(geo, st.gradient_checkpointing)
           + mb.images * vision_activation_bytes(geo, st.gradient_checkpointing))
    assert train["activations"] * GIB == pytest.approx(act)
    # The head sees at most the budget's tokens (fewer than the rank's 16 responses).
    assert train["logits"] * GIB == pytest.approx(
        logprob_bytes(geo.shape, 2, geo.logprob_chunk_tokens, 20_000, trained_head=True))
    # The attention layout: the dense 4-D mask would be rows x width^2 <= budget x the
    # widest row (P + n R), in bf16; by segment, the rank's 16 responses each a slot of
    # R queries against P + R keys (the mask), their gathers (int64), two places per
    # response token (at most the budget's) and the rows' int32 segment ids. The trainer
    # takes the smaller, so the plan counts the smaller: here the segments, 0.55x.
    dense = 2 * 20_000 * (PROMPT + N * RESPONSE)
    by_segment = (16 * RESPONSE * (PROMPT + RESPONSE) * 2 + 16 * (RESPONSE + PROMPT
                  + RESPONSE) * 8 + 20_000 * 16 + 20_000 * 4)
    assert train["attention_mask"] * GIB == pytest.approx(by_segment)
    assert by_segment < 0.55 * dense


def test_a_pinned_micro_batch_size_goes_by_samples_in_the_shared_layout() -> None:
    spec = _spec(microBatchSize=4)
    plan = plan_memory(spec)
    assert plan.settings.micro_batch_tokens == 0
    assert trainer_config(spec, plan, JobRef("j", "ns", "u"))["actor"].get(
        "micro_batch_tokens") is None
    mb = micro_batch(plan.geometry, plan.settings)
    # 4 samples span at most 2 groups; rows pad to the widest: max(P + 4R, 2 (P + 3R)).
    assert mb.tokens == max(PROMPT + 4 * RESPONSE, 2 * (PROMPT + 3 * RESPONSE))
    assert mb.images == 2 and mb.response_tokens == 4 * RESPONSE
    # Responses long next to the prompt: the rows pad past the padded layout's 4 s.
    short_prompt = micro_batch(plan_memory(_spec(prompt=256, microBatchSize=4)).geometry,
                               plan.settings)
    assert short_prompt.tokens == 2 * (256 + 3 * RESPONSE) > 4 * (256 + RESPONSE)


@pytest.mark.parametrize("memory, field", [
    ({"microBatchSize": 2, "microBatchTokens": 9000}, "microBatchTokens and"),
    ({"microBatchTokens": PROMPT + RESPONSE - 1}, "cannot hold one whole sample"),
])
def test_a_budget_that_cannot_work_is_refused(memory: dict[str, int], field: str) -> None:
    with pytest.raises((SpecError, ValueError), match=field):
        _spec(**memory)


def test_the_ladder_halves_the_budget_down_to_one_sample_and_leaves_a_pinned_one() -> None:
    plan = plan_memory(_spec())
    seen = [plan.settings.micro_batch_tokens]
    while (nxt := next_safer_plan(plan, FailureReason.CUDA_OOM)) is not None:
        if nxt.rungs[-1] == "halve micro-batch":
            seen.append(nxt.settings.micro_batch_tokens)
        plan = nxt
    assert seen[1] == seen[0] // 2 >= PROMPT + RESPONSE
    pinned = plan_memory(_spec(microBatchTokens=PROMPT + RESPONSE))
    rungs = []
    while (nxt := next_safer_plan(pinned, FailureReason.CUDA_OOM)) is not None:
        rungs.append(nxt.rungs[-1])
        pinned = nxt
    assert "halve micro-batch" not in rungs
    assert pinned.settings.micro_batch_tokens == PROMPT + RESPONSE
