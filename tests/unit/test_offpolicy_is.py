"""Truncated importance weights for samples drawn by an older policy (offpolicy.py) and
their effect on the GRPO loss, against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_trainer.algorithm.grpo_math import grpo_loss
from grpo_trainer.algorithm.offpolicy import (
    OffpolicySums,
    is_weights,
    offpolicy_metrics,
    version_gaps,
)

pytestmark = pytest.mark.unit

CAP = 2.0


def _logs(*probs: float) -> torch.Tensor:
    return torch.log(torch.tensor([probs], dtype=torch.float32))


def test_gaps_count_updates_since_the_sample_was_drawn() -> None:
    # Updating version 3: a colocated sample (None) and one drawn by version 3 are
    # on-policy; version 2's is one update behind, version 1's two.
    assert version_gaps([None, 3, 2, 1], policy_version=3) == [0, 0, 1, 2]
    with pytest.raises(ValueError, match="newer than the policy"):
        version_gaps([4], policy_version=3)


def test_stale_tokens_weigh_the_truncated_ratio_and_fresh_ones_exactly_one() -> None:
    # pi_proximal / pi_behaviour per token: 0.6/0.2 = 3 (cut to the cap 2), 0.3/0.3 = 1,
    # 0.2/0.8 = 0.25 (never raised: only the top is truncated).
    proximal = _logs(0.6, 0.3, 0.2).repeat(2, 1)
    behaviour = _logs(0.2, 0.3, 0.8).repeat(2, 1)
    gap = torch.tensor([[1.0], [0.0]])  # row 0 one version stale, row 1 fresh
    w = is_weights(proximal, behaviour, gap.expand(2, 3), CAP)
    assert torch.allclose(w[0], torch.tensor([2.0, 1.0, 0.25]), atol=1e-6)
    # The fresh row: exactly 1, although its engine/trainer ratios are not 1.
    assert torch.equal(w[1], torch.ones(3))


def test_a_huge_log_ratio_is_the_cap_not_inf() -> None:
    # exp(0 - (-100)) overflows float32; the weight is the cap.
    w = is_weights(torch.zeros(1, 1), torch.full((1, 1), -100.0), torch.ones(1, 1), CAP)
    assert w.item() == CAP


def test_the_weight_scales_each_tokens_loss_and_gradient_and_carries_none() -> None:
    # On the proximal policy itself (ratio 1, nothing clipped), advantage +1: each
    # token's clipped term is -A * ratio = -1; weighted by (2, 1, 0.25) it is
    # (-2, -1, -0.25), and the token mean over 3 tokens is -3.25 / 3.
    old = _logs(0.6, 0.3, 0.2)
    logp = old.clone().requires_grad_(True)
    weight = torch.tensor([[2.0, 1.0, 0.25]], requires_grad=True)
    out = grpo_loss(logp, old, torch.tensor([1.0]), torch.ones(1, 3), 3.0,
                    clip_low=0.2, clip_high=0.3, clip_dual=3.0, is_weight=weight)
    assert out.pg_loss.item() == pytest.approx(-3.25 / 3)
    out.loss.backward()
    # d/d logp of -A * exp(logp - old) * w / 3 at ratio 1: -w / 3.
    assert logp.grad is not None
    assert torch.allclose(logp.grad, torch.tensor([[-2.0, -1.0, -0.25]]) / 3)
    assert weight.grad is None  # a constant of the loss


def test_weights_of_one_train_bit_identically_to_no_weights() -> None:
    torch.manual_seed(0)
    old = torch.randn(2, 5) - 2.0
    new = old + 0.3 * torch.randn(2, 5)
    adv, mask = torch.tensor([0.7, -1.3]), (torch.rand(2, 5) > 0.2).float()
    results = []
    for weight in (None, torch.ones(2, 5)):
        logp = new.clone().requires_grad_(True)
        out = grpo_loss(logp, old, adv, mask, 9.0, clip_low=0.2, clip_high=0.3,
                        clip_dual=3.0, is_weight=weight)
        out.loss.backward()
        results.append((out.loss.detach(), logp.grad))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_step_metrics_combine_every_ranks_sums() -> None:
    # Rank A: two samples one version stale, 3 tokens weighing (2, 1, 0.25), the first
    # at the cap. Rank B: two fresh samples, 2 tokens weighing 1 each, and a padding
    # token (mask 0) that counts nowhere.
    a, b = OffpolicySums(), OffpolicySums()
    a.add_gaps([1, 1])
    a.add_weights(torch.tensor([[2.0, 1.0, 0.25]]), torch.ones(1, 3), CAP)
    b.add_gaps([0, 0])
    b.add_weights(torch.tensor([[1.0, 1.0, 9.0]]), torch.tensor([[1.0, 1.0, 0.0]]), CAP)
    summed = [getattr(a, k) + getattr(b, k) for k in OffpolicySums.SUMMED]
    maxed = [max(getattr(a, k), getattr(b, k)) for k in OffpolicySums.MAXED]
    m = offpolicy_metrics(summed, maxed)
    assert m["offpolicy/version_gap_mean"] == pytest.approx(2 / 4)
    assert m["offpolicy/version_gap_max"] == 1.0
    # (2 + 1 + 0.25 + 1 + 1) / 5 tokens = 1.05
    assert m["offpolicy/is_weight_mean"] == pytest.approx(1.05)
    assert (m["offpolicy/is_weight_min"], m["offpolicy/is_weight_max"]) == (0.25, 2.0)
    assert m["offpolicy/is_clipped_frac"] == pytest.approx(1 / 5)


def test_unweighted_micro_batches_count_as_weight_one() -> None:
    s = OffpolicySums()
    s.add_gaps([0, 0, 0])
    s.add_unweighted(7)
    m = offpolicy_metrics([getattr(s, k) for k in OffpolicySums.SUMMED],
                          [getattr(s, k) for k in OffpolicySums.MAXED])
    assert m == {
        "offpolicy/version_gap_mean": 0.0, "offpolicy/version_gap_max": 0.0,
        "offpolicy/is_weight_mean": 1.0, "offpolicy/is_weight_min": 1.0,
        "offpolicy/is_weight_max": 1.0, "offpolicy/is_clipped_frac": 0.0,
    }
    assert all(math.isfinite(v) for v in m.values())
