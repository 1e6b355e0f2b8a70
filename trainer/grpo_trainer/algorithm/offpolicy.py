"""Off-policy correction for bounded-staleness rollouts, as pure tensor functions.

With ``rollout.placement: disaggregated`` and ``rollout.max_staleness >= 1`` a batch may
have been sampled by a policy version older than the one being updated. The update keeps
PPO's clipped objective against the proximal policy (the old log-probs the ranks
recompute before the update) and weights each token of such a sample by the truncated
importance ratio ``w = min(pi_proximal / pi_behaviour, cap)`` (the decoupled objective of
AReaL, truncated as in verl's TIS). ``pi_behaviour`` is the engine's own log-prob of the
sampled token. ``w`` is a constant of the loss (no gradient flows through it).

A sample drawn by the policy being updated (version gap 0) gets ``w = 1`` exactly, not
``exp(proximal - behaviour)``: that ratio is then only the engine/trainer numeric
mismatch (``rollout/logprob_abs_diff_mean`` reports it), and staleness 0 must train
exactly as the colocated trainer does.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


def version_gaps(sample_versions: Sequence[int | None], policy_version: int) -> list[int]:
    """How many updates each sample's policy lags ``policy_version`` (the version being
    updated: the number of updates applied so far). ``None``: drawn by the current
    policy (colocated rollouts). A sample from a newer policy than the update's is a
    bookkeeping error, never something to weight."""
    gaps = [0 if v is None else policy_version - v for v in sample_versions]
    if any(g < 0 for g in gaps):
        raise ValueError(f"samples of versions {list(sample_versions)} are newer than the "
                         f"policy being updated ({policy_version})")
    return gaps


def is_weights(
    proximal: torch.Tensor, behaviour: torch.Tensor, gap: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token truncated importance weights, detached.

    ``proximal``, ``behaviour`` and ``gap`` have one shape (``[B, T]``, or ``gap`` ``[B, 1]``
    to broadcast a sample's gap over its tokens). Tokens with ``gap >= 1`` get
    ``min(exp(proximal - behaviour), cap)``; the others exactly 1.
    """
    # The log-ratio is clamped before exp for the same reason as the PPO ratio's: the
    # cap bounds the result, but exp of a huge difference would be inf first.
    log_ratio = torch.clamp(proximal.detach().float() - behaviour.detach().float(), max=20.0)
    w = torch.clamp(torch.exp(log_ratio), max=cap)
    return torch.where(gap >= 1, w, torch.ones_like(w))


@dataclass
class OffpolicySums:
    """One rank's sums over the step's off-policy statistics, reduced over ranks (sums,
    and maxima: ``min`` is kept negated so that one max-reduce takes both)."""

    gap_sum: float = 0.0
    gap_max: float = 0.0
    samples: float = 0.0
    weight_sum: float = 0.0
    weight_max: float = float("-inf")
    neg_weight_min: float = float("-inf")
    clipped: float = 0.0
    tokens: float = 0.0

    SUMMED = ("gap_sum", "samples", "weight_sum", "clipped", "tokens")
    MAXED = ("gap_max", "weight_max", "neg_weight_min")

    def add_gaps(self, gaps: Sequence[int]) -> None:
        self.gap_sum += float(sum(gaps))
        self.samples += len(gaps)
        self.gap_max = max([self.gap_max, *map(float, gaps)])

    def add_weights(self, weights: torch.Tensor, mask: torch.Tensor, cap: float) -> None:
        """One micro-batch's ``is_weights`` over its response tokens (``mask`` 1)."""
        valid = mask.bool()
        picked = weights[valid]
        if picked.numel() == 0:
            return
        self.weight_sum += float(picked.sum())
        self.weight_max = max(self.weight_max, float(picked.max()))
        self.neg_weight_min = max(self.neg_weight_min, -float(picked.min()))
        self.clipped += float((picked >= cap).sum())
        self.tokens += picked.numel()

    def add_unweighted(self, tokens: int) -> None:
        """A micro-batch with no stale sample: every token weighs exactly 1."""
        if tokens <= 0:
            return
        self.weight_sum += float(tokens)
        self.weight_max = max(self.weight_max, 1.0)
        self.neg_weight_min = max(self.neg_weight_min, -1.0)
        self.tokens += tokens


def offpolicy_metrics(summed: Sequence[float], maxed: Sequence[float]) -> dict[str, float]:
    """The step's ``offpolicy/*`` metrics from every rank's reduced ``OffpolicySums``
    (``summed`` in ``SUMMED`` order, ``maxed`` in ``MAXED`` order). The weights are over
    every trained response token, the gap-0 ones (weight 1) included; the clipped
    fraction is the share of those tokens whose weight the cap truncated."""
    s = dict(zip(OffpolicySums.SUMMED, summed, strict=True))
    m = dict(zip(OffpolicySums.MAXED, maxed, strict=True))
    tokens = s["tokens"]
    return {
        "offpolicy/version_gap_mean": s["gap_sum"] / max(s["samples"], 1.0),
        "offpolicy/version_gap_max": m["gap_max"],
        "offpolicy/is_weight_mean": s["weight_sum"] / tokens if tokens else 1.0,
        "offpolicy/is_weight_min": -m["neg_weight_min"] if tokens else 1.0,
        "offpolicy/is_weight_max": m["weight_max"] if tokens else 1.0,
        "offpolicy/is_clipped_frac": s["clipped"] / tokens if tokens else 0.0,
    }
