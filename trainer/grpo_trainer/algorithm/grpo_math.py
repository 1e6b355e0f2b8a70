"""GRPO maths as pure tensor functions (no distributed state, no models).

Conventions: per-token tensors are ``[batch, response_len]`` and come with a
``mask`` of the same shape (1 for response tokens up to and including EOS, 0 for
padding). Losses are returned per token; aggregation is a separate step so that
the global token-mean across ranks and accumulation steps is explicit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

KLEstimator = Literal["k1", "k3", "low_var_kl"]


def group_advantages(
    rewards: torch.Tensor, group_size: int, norm_by_std: bool = True, eps: float = 1e-6
) -> torch.Tensor:
    """Outcome advantages: each reward minus its group's mean, optionally over its std.

    ``rewards`` is ``[num_groups * group_size]`` with each group contiguous. A group
    whose rewards are all equal gets zero advantage (nothing to learn from it), also
    with std normalisation (the eps keeps it finite). Dr.GRPO-style runs turn the std
    division off because it up-weights near-uniform groups.
    """
    if rewards.dim() != 1 or rewards.numel() % group_size:
        raise ValueError(f"rewards must be 1-D with a multiple of {group_size} entries")
    grouped = rewards.float().view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    if norm_by_std:
        # Unbiased std, as the GRPO paper and verl/EasyR1 use (torch.std default).
        centred = centred / (grouped.std(dim=1, keepdim=True) + eps)
    return centred.view(-1)


@dataclass(frozen=True)
class PolicyLossOut:
    loss: torch.Tensor  # per token, [B, T]
    clipped: torch.Tensor  # per token bool: the (1 +- eps) clip was active
    dual_clipped: torch.Tensor  # per token bool: the dual clip bound was active
    ratio: torch.Tensor


def clipped_policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    clip_dual: float | None = None,
) -> PolicyLossOut:
    """PPO/GRPO clipped surrogate with asymmetric clip range and optional dual clip.

    ``advantages`` is ``[B]`` (outcome) or ``[B, T]``. The ratio is clipped to
    ``[1 - clip_low, 1 + clip_high]`` (DAPO's clip-higher keeps low-probability
    tokens learnable). Dual clip (Ye et al. 2020) bounds the loss of negative-advantage
    tokens at ``-A * clip_dual`` so a huge ratio on a bad token cannot dominate.
    """
    adv = advantages if advantages.dim() == log_prob.dim() else advantages.unsqueeze(-1)
    # Clamp the log-ratio before exp: a stale token with ratio e^30 would be inf.
    log_ratio = torch.clamp(log_prob - old_log_prob, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss = torch.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    dual = torch.zeros_like(was_clipped)
    if clip_dual is not None:
        bound = -adv * clip_dual
        dual = (adv < 0) & (loss > bound)
        loss = torch.where(adv < 0, torch.minimum(loss, bound), loss)
    return PolicyLossOut(loss=loss, clipped=was_clipped, dual_clipped=dual, ratio=ratio)


def kl_penalty(
    log_prob: torch.Tensor, ref_log_prob: torch.Tensor, estimator: KLEstimator
) -> torch.Tensor:
    """Per-token KL(pi || ref) estimate from sampled tokens (Schulman's k1/k3).

    k1 is unbiased but high variance and can be negative; k3 is unbiased and
    non-negative; ``low_var_kl`` is k3 with the log-ratio and result clamped to
    [-10, 10], as verl/EasyR1 do, so one outlier token cannot blow up the loss.
    """
    diff = log_prob - ref_log_prob
    if estimator == "k1":
        return diff
    if estimator == "k3":
        return torch.exp(-diff) + diff - 1.0
    if estimator == "low_var_kl":
        neg = torch.clamp(-diff, -20.0, 20.0)
        return torch.clamp(torch.exp(neg) - neg - 1.0, -10.0, 10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}")


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log p(label) per position, computed in float32 without materialising softmax."""
    logits = logits.float()
    picked = torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-position entropy of the categorical distribution given by ``logits``."""
    logits = logits.float()
    logz = torch.logsumexp(logits, dim=-1)
    probs = torch.softmax(logits, dim=-1)
    return logz - (probs * logits).sum(dim=-1)


def masked_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum()


def token_mean(values: torch.Tensor, mask: torch.Tensor, global_tokens: float) -> torch.Tensor:
    """This micro-batch's share of the global token mean.

    ``global_tokens`` is the number of valid tokens in the whole mini-batch summed
    over every rank and every accumulation step. Summing this over micro-batches and
    ranks gives exactly ``sum(values * mask) / global_tokens``, so long and short
    responses weigh per token wherever they landed; dividing by a local count would
    over-weight ranks or micro-batches with few tokens.
    """
    if global_tokens <= 0:
        return values.sum() * 0.0
    return masked_sum(values, mask) / global_tokens


@dataclass(frozen=True)
class GRPOLossOut:
    loss: torch.Tensor  # scalar: this micro-batch's share of the mini-batch loss
    pg_loss: torch.Tensor
    kl: torch.Tensor
    entropy: torch.Tensor
    clip_tokens: torch.Tensor  # number of clipped tokens (sum, not mean)
    dual_clip_tokens: torch.Tensor


def grpo_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    global_tokens: float,
    *,
    clip_low: float,
    clip_high: float,
    clip_dual: float | None,
    ref_log_prob: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "low_var_kl",
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    is_weight: torch.Tensor | None = None,
) -> GRPOLossOut:
    """Policy loss + KL loss term - entropy bonus, each a global token mean.

    ``is_weight`` (per token, detached; ``offpolicy.is_weights``) scales each token's
    clipped policy term for samples drawn by an older policy; None: every token 1."""
    mask = mask.to(log_prob.dtype)
    pg = clipped_policy_loss(log_prob, old_log_prob, advantages, clip_low, clip_high, clip_dual)
    token_pg = pg.loss if is_weight is None else pg.loss * is_weight.detach()
    pg_loss = token_mean(token_pg, mask, global_tokens)
    total = pg_loss
    kl = torch.zeros((), dtype=log_prob.dtype)
    if ref_log_prob is not None and kl_coef > 0:
        kl = token_mean(kl_penalty(log_prob, ref_log_prob, kl_estimator), mask, global_tokens)
        total = total + kl_coef * kl
    ent = torch.zeros((), dtype=log_prob.dtype)
    if entropy is not None:
        ent = token_mean(entropy, mask, global_tokens)
        if entropy_coef > 0:
            total = total - entropy_coef * ent
    return GRPOLossOut(
        loss=total,
        pg_loss=pg_loss.detach(),
        kl=kl.detach(),
        entropy=ent.detach(),
        clip_tokens=masked_sum(pg.clipped.to(mask.dtype), mask).detach(),
        dual_clip_tokens=masked_sum(pg.dual_clipped.to(mask.dtype), mask).detach(),
    )
