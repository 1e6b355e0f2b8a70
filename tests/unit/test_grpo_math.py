"""GRPO maths: advantages, clipped loss, KL estimators, token-mean aggregation."""

from __future__ import annotations

import math

import pytest
import torch

from grpo_trainer.algorithm.grpo_math import (
    clipped_policy_loss,
    entropy_from_logits,
    group_advantages,
    grpo_loss,
    kl_penalty,
    log_probs_from_logits,
    token_mean,
)

pytestmark = pytest.mark.unit


def test_advantages_are_centred_and_scaled_per_group() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 5.0, 5.0, 5.0, 5.0])
    adv = group_advantages(rewards, group_size=4)
    first = adv[:4]
    assert first[0] > 0 and (first[1:] < 0).all()
    assert first.sum().abs() < 1e-5
    assert torch.allclose(first.std(), torch.tensor(1.0), atol=1e-4)
    # A group where every sample got the same reward teaches nothing.
    assert torch.equal(adv[4:], torch.zeros(4))


def test_advantages_without_std_normalisation_keep_reward_scale() -> None:
    rewards = torch.tensor([2.0, 0.0, 4.0, 2.0])
    adv = group_advantages(rewards, group_size=4, norm_by_std=False)
    assert torch.allclose(adv, torch.tensor([0.0, -2.0, 2.0, 0.0]))


def test_advantages_reject_partial_groups() -> None:
    with pytest.raises(ValueError):
        group_advantages(torch.zeros(5), group_size=4)


def test_clip_is_asymmetric_and_only_binds_in_the_improving_direction() -> None:
    old = torch.zeros(1, 4)
    # ratios: 0.5, 0.9, 1.25, 2.0
    new = torch.log(torch.tensor([[0.5, 0.9, 1.25, 2.0]]))
    pos = clipped_policy_loss(new, old, torch.tensor([1.0]), clip_low=0.2, clip_high=0.3)
    # Positive advantage: gains above 1 + 0.3 are cut, losses are never clipped.
    assert torch.allclose(pos.loss, -torch.tensor([[0.5, 0.9, 1.25, 1.3]]))
    assert pos.clipped.tolist() == [[False, False, False, True]]
    neg = clipped_policy_loss(new, old, torch.tensor([-1.0]), clip_low=0.2, clip_high=0.3)
    # Negative advantage: pushing the ratio below 1 - 0.2 stops paying.
    assert torch.allclose(neg.loss, torch.tensor([[0.8, 0.9, 1.25, 2.0]]))
    assert neg.clipped.tolist() == [[True, False, False, False]]


def test_dual_clip_bounds_negative_advantage_loss() -> None:
    old = torch.zeros(1, 2)
    new = torch.log(torch.tensor([[10.0, 2.0]]))
    out = clipped_policy_loss(new, old, torch.tensor([-1.0]), 0.2, 0.3, clip_dual=3.0)
    assert torch.allclose(out.loss, torch.tensor([[3.0, 2.0]]))
    assert out.dual_clipped.tolist() == [[True, False]]
    pos = clipped_policy_loss(new, old, torch.tensor([1.0]), 0.2, 0.3, clip_dual=3.0)
    assert not pos.dual_clipped.any()


def test_policy_gradient_sign_raises_probability_of_good_tokens() -> None:
    logits = torch.zeros(1, 1, 3, requires_grad=True)
    labels = torch.tensor([[1]])
    lp = log_probs_from_logits(logits, labels)
    out = grpo_loss(
        lp,
        lp.detach(),
        torch.tensor([1.0]),
        torch.ones(1, 1),
        1.0,
        clip_low=0.2,
        clip_high=0.3,
        clip_dual=None,
    )
    out.loss.backward()
    assert logits.grad is not None
    # Gradient descent on the loss increases the chosen token's logit.
    assert logits.grad[0, 0, 1] < 0 and logits.grad[0, 0, 0] > 0


def test_kl_estimators_match_definitions() -> None:
    lp = torch.tensor([math.log(0.5), math.log(0.2)])
    ref = torch.tensor([math.log(0.25), math.log(0.2)])
    assert torch.allclose(kl_penalty(lp, ref, "k1"), torch.tensor([math.log(2.0), 0.0]))
    k3 = kl_penalty(lp, ref, "k3")
    assert torch.allclose(k3, torch.tensor([0.5 - 1 + math.log(2.0), 0.0]), atol=1e-6)
    assert (k3 >= 0).all()
    assert torch.allclose(kl_penalty(lp, ref, "low_var_kl"), k3, atol=1e-6)
    # The low-variance estimator is clamped so one outlier cannot dominate.
    far = kl_penalty(torch.tensor([-30.0]), torch.tensor([0.0]), "low_var_kl")
    assert far.item() == 10.0


def test_k3_is_unbiased_estimate_of_kl() -> None:
    torch.manual_seed(0)
    p = torch.tensor([0.6, 0.3, 0.1])
    q = torch.tensor([0.3, 0.3, 0.4])
    exact = (p * (p / q).log()).sum()
    samples = torch.multinomial(p, 200_000, replacement=True)
    est = kl_penalty(p.log()[samples], q.log()[samples], "k3").mean()
    assert abs(est.item() - exact.item()) < 0.01


def test_entropy_and_log_probs_from_logits() -> None:
    logits = torch.log(torch.tensor([[[0.5, 0.25, 0.25]]]))
    assert torch.allclose(entropy_from_logits(logits), torch.tensor([[1.5 * math.log(2.0)]]))
    lp = log_probs_from_logits(logits, torch.tensor([[0]]))
    assert torch.allclose(lp, torch.tensor([[math.log(0.5)]]))


def test_token_mean_over_shards_equals_mean_over_all_tokens() -> None:
    torch.manual_seed(0)
    values = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.4).float()
    total = mask.sum().item()
    expected = (values * mask).sum() / total
    # Two ranks x two accumulation steps with very different token counts.
    shards = [slice(0, 1), slice(1, 2), slice(2, 5), slice(5, 6)]
    summed = sum(token_mean(values[s], mask[s], total) for s in shards)
    assert torch.allclose(summed, expected)
    local_means = torch.stack([(values[s] * mask[s]).sum() / mask[s].sum() for s in shards])
    assert not torch.allclose(local_means.mean(), expected)


def test_grpo_loss_adds_kl_and_entropy_terms() -> None:
    lp = torch.log(torch.full((2, 3), 0.5))
    ref = torch.log(torch.full((2, 3), 0.25))
    mask = torch.ones(2, 3)
    ent = torch.full((2, 3), 2.0)
    base = grpo_loss(
        lp, lp, torch.tensor([1.0, -1.0]), mask, 6.0, clip_low=0.2, clip_high=0.3, clip_dual=3.0
    )
    full = grpo_loss(
        lp,
        lp,
        torch.tensor([1.0, -1.0]),
        mask,
        6.0,
        clip_low=0.2,
        clip_high=0.3,
        clip_dual=3.0,
        ref_log_prob=ref,
        kl_coef=0.1,
        kl_estimator="k1",
        entropy=ent,
        entropy_coef=0.01,
    )
    assert torch.allclose(full.kl, torch.tensor(math.log(2.0)))
    assert torch.allclose(full.loss, base.loss + 0.1 * math.log(2.0) - 0.01 * 2.0)
