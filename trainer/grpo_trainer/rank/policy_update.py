"""The update half of one FSDP2 rank: old and reference log-probs, then the clipped GRPO
loss over mini- and micro-batches, one optimizer step per mini-batch, and the step's
update metrics (every rank's sums, all-reduced).

``PolicyUpdate`` works on the rank's ``RankState`` (models, optimizer, scheduler, device,
world), the one ``checkpointing.rank.RankCheckpointer`` saves; each step's samples are
handed to ``run``. The loss maths is in ``grpo_math``, the log-probs' chunked LM head in
``lean_logprobs``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from ..algorithm.grpo_math import GRPOLossOut, grpo_loss
from ..algorithm.lean_logprobs import lean_log_probs
from ..algorithm.micro_batches import count_for_budget, split_evenly
from ..algorithm.offpolicy import OffpolicySums, is_weights, offpolicy_metrics, version_gaps
from ..algorithm.packing import can_pack, collate_packed, rope_index_of
from ..algorithm.samples import Sample, TrainBatch, collate_train
from ..lora import adapters_disabled
from ..model.modeling import params_home
from ..model.rank_state import RankState
from ..model.segment_attention import installed as segment_attention_installed

log = logging.getLogger(__name__)


@dataclass
class UpdateStats:
    """One rank's sums over a step's update (all-reduced into the step's metrics): the
    loss terms summed over micro-batches, token counts, optimizer steps taken."""

    pg_loss: float = 0.0
    kl: float = 0.0
    entropy: float = 0.0
    clip_tokens: float = 0.0
    dual_clip_tokens: float = 0.0
    tokens: float = 0.0
    optimizer_steps: float = 0.0
    micro_batches: float = 0.0
    grad_norms: list[float] = field(default_factory=list)  # per optimizer step, not summed

    _SUMMED = (
        "pg_loss", "kl", "entropy", "clip_tokens", "dual_clip_tokens", "tokens", "optimizer_steps",
        "micro_batches",
    )

    def add_loss(self, out: GRPOLossOut) -> None:
        """One micro-batch's ``GRPOLossOut``."""
        self.pg_loss += out.pg_loss.item()
        self.kl += out.kl.item()
        self.entropy += out.entropy.item()
        self.clip_tokens += out.clip_tokens.item()
        self.dual_clip_tokens += out.dual_clip_tokens.item()

    def sums(self) -> list[float]:
        return [float(getattr(self, name)) for name in self._SUMMED]

    @classmethod
    def from_sums(cls, values: Sequence[float]) -> UpdateStats:
        stats = cls()
        for name, value in zip(cls._SUMMED, values, strict=True):
            setattr(stats, name, value)
        return stats


def _chunks(items: Sequence[Sample], size: int) -> Iterator[list[Sample]]:
    for i in range(0, len(items), size):
        yield list(items[i : i + size])


def _filled(log_probs: torch.Tensor | None, which: str) -> torch.Tensor:
    if log_probs is None:  # run() fills them before the policy update reads them
        raise RuntimeError(f"{which} log-probs were not computed before the update")
    return log_probs


class PolicyUpdate:
    """The update of ``state`` (which it steps, holding no state of its own); ``pad_id``
    is the tokenizer's, which the training collation pads with."""

    def __init__(self, state: RankState, pad_id: int) -> None:
        self.state = state
        self.pad_id = pad_id
        # The model's own M-RoPE positions (Qwen2/2.5/3-VL), without which an image
        # batch cannot take the shared-prefix layout; the reference has the same.
        self.rope = rope_index_of(state.actor)
        # Packed batches attend by segment where the models were built to (modeling.py:
        # sdpa models; the reference is built as the actor is).
        self.segments = segment_attention_installed(state.actor)
        self.forward_tokens = 0  # this step's, every pass: rows x width, padding included
        # The policy version being updated (updates applied before this step) and the
        # step's off-policy statistics (offpolicy.py), both set by run().
        self.version = 0
        self.offpolicy = OffpolicySums()

    def run(self, samples: Sequence[Sample], step: int) -> dict[str, float]:
        """Recompute old (and reference) log-probs of ``samples``, then the clipped GRPO
        update; each stage timed on this rank (the driver reports the slowest rank's
        times). The samples carry their advantages already."""
        st, cfg = self.state, self.state.cfg
        # One optimizer step per rollout batch: the policy cannot move before its
        # log-probs are taken, so the update forward's detached log-probs are the
        # old ones and a separate recompute pass would be wasted work.
        on_policy = cfg.actor.ppo_epochs == 1 and cfg.mini_batch_samples == cfg.samples_per_step
        self.forward_tokens = 0
        self.version = step - 1
        self.offpolicy = OffpolicySums()
        self.offpolicy.add_gaps(version_gaps([s.policy_version for s in samples], self.version))
        t0 = time.perf_counter()
        if not on_policy:
            self._fill(st.actor, samples, "old_log_probs")
        t1 = time.perf_counter()
        if st.ref is not None:
            with adapters_disabled(st.ref):
                self._fill(st.ref, samples, "ref_log_probs")
        t2 = time.perf_counter()
        stats = self._policy_update(samples, step, on_policy)
        t3 = time.perf_counter()
        return {
            **self._update_metrics(samples, stats),
            "time/old_logprob_s": t1 - t0,
            "time/ref_logprob_s": t2 - t1,
            "time/update_s": t3 - t2,
        }

    def log_probs(
        self, model: nn.Module, micro: list[Sample], with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None, TrainBatch]:
        """``model``'s log-probs of the micro-batch's response tokens (and their entropy),
        and the collated batch that maps them back to samples. The LM head runs on the
        response positions only, ``actor.logprob_chunk_tokens`` at a time (lean_logprobs):
        no [batch, sequence, vocabulary] logits. The entropy carries a gradient only with
        an entropy bonus; as a metric it comes from the same chunks at no extra memory."""
        st = self.state
        batch = self._collate(micro)
        self.forward_tokens += batch.model_inputs["input_ids"].numel()
        inputs = {k: v.to(st.device) for k, v in batch.model_inputs.items()}
        out = lean_log_probs(
            model, inputs, batch,
            temperature=st.cfg.rollout.temperature,
            chunk=st.cfg.actor.logprob_chunk_tokens,
            entropy=with_entropy,
            entropy_grad=with_entropy and st.cfg.algorithm.entropy_coef > 0,
        )
        return out.logp, out.entropy, batch

    def _packs(self, samples: Sequence[Sample]) -> bool:
        return self.state.cfg.actor.shared_prefix and can_pack(list(samples), self.rope)

    def _collate(self, micro: list[Sample]) -> TrainBatch:
        # Shared-prefix packing needs a 4-D attention mask (eager) or a segment layout
        # (sdpa, model/segment_attention.py). Either is made on the rank's device from
        # the segment ids (a [rows, width^2] mask made on the host would be copied over).
        if self._packs(micro):
            return collate_packed(micro, self.pad_id, self.state.compute_dtype, self.rope,
                                  device=self.state.device, segments=self.segments)
        return collate_train(micro, self.pad_id)

    def micro_batches(self, samples: Sequence[Sample]) -> list[list[Sample]]:
        """``samples`` cut into this pass's micro-batches: ``actor.micro_batch_size``
        samples each, or filled up to ``actor.micro_batch_tokens`` (micro_batches.py),
        as many on every rank as the rank that needs the most (a collective)."""
        actor = self.state.cfg.actor
        if actor.micro_batch_tokens is None:
            return list(_chunks(samples, actor.micro_batch_size))
        items, packed = list(samples), self._packs(samples)
        need = count_for_budget(items, actor.micro_batch_tokens, packed)
        return split_evenly(items, int(self._all_max([need])[0]), packed)

    @torch.no_grad()
    def _fill(self, model: nn.Module, samples: Sequence[Sample], attr: str) -> None:
        for micro in self.micro_batches(samples):
            logp, _, batch = self.log_probs(model, micro, with_entropy=False)
            for s, lp in zip(micro, batch.gather(logp.cpu()), strict=True):
                setattr(s, attr, lp.clone())

    def _all_sum(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.state.device)
        dist.all_reduce(t, group=self.state.world.group)
        return [float(v) for v in t.cpu()]

    def _all_max(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.state.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.state.world.group)
        return [float(v) for v in t.cpu()]

    def _policy_update(self, samples: Sequence[Sample], step: int, on_policy: bool) -> UpdateStats:
        """``actor.ppo_epochs`` x mini-batches x micro-batches of the clipped loss, one
        optimizer step per mini-batch."""
        st, cfg = self.state, self.state.cfg
        st.actor.train()  # HF only checkpoints activations in train mode
        mini = cfg.mini_batch_samples // st.world.size
        stats = UpdateStats()
        for _epoch in range(cfg.actor.ppo_epochs):
            for mini_batch in _chunks(samples, mini):
                local_tokens = sum(int(s.response_ids.numel()) for s in mini_batch)
                global_tokens = self._all_sum([local_tokens])[0]
                # Every micro-batch's backward reduce-scatters its gradients into the
                # shards, where they accumulate: with gradient sync off FSDP2 would keep
                # each parameter's whole float32 gradient until the last micro-batch
                # (4 bytes x every parameter on every rank), which no plan could afford
                # (docs/memory-model.md, "Gradient accumulation").
                for micro in self.micro_batches(mini_batch):
                    stats.add_loss(self._micro_step(micro, global_tokens, on_policy))
                    stats.micro_batches += 1
                stats.tokens += local_tokens
                self._optimizer_step(step, stats)
        return stats

    def _micro_step(
        self, micro: list[Sample], global_tokens: float, on_policy: bool
    ) -> GRPOLossOut:
        """Forward and backward of one micro-batch; its loss terms for the metrics."""
        st = self.state
        alg, dev = st.cfg.algorithm, st.device
        logp, ent, batch = self.log_probs(st.actor, micro, with_entropy=True)
        if on_policy:
            old = logp.detach()
            for s, lp in zip(micro, batch.gather(old.cpu()), strict=True):
                s.old_log_probs = lp.clone()
        else:
            old = batch.scatter([_filled(s.old_log_probs, "old") for s in micro]).to(dev)
        ref = (
            batch.scatter([_filled(s.ref_log_probs, "reference") for s in micro]).to(dev)
            if st.ref is not None
            else None
        )
        adv = batch.scatter(
            [torch.full((s.response_ids.numel(),), s.advantage) for s in micro]
        ).to(dev)
        mask = batch.response_mask.to(dev)
        weight = self._is_weights(micro, batch, old, mask)
        out = grpo_loss(
            logp,
            old,
            adv,
            mask,
            global_tokens,
            clip_low=alg.clip_ratio_low,
            clip_high=alg.clip_ratio_high,
            clip_dual=alg.clip_ratio_dual,
            ref_log_prob=ref,
            kl_coef=alg.kl_coef,
            kl_estimator=alg.kl_estimator,
            entropy=ent,
            entropy_coef=alg.entropy_coef,
            is_weight=weight,
        )
        # FSDP averages gradients over ranks; each rank's loss is already its share of
        # the global token mean, so undo the average.
        (out.loss * st.world.size).backward()
        return out

    def _is_weights(self, micro: list[Sample], batch: TrainBatch, proximal: torch.Tensor,
                    mask: torch.Tensor) -> torch.Tensor | None:
        """The micro-batch's truncated importance weights (offpolicy.py), counted into the
        step's statistics; None when every sample is the updated policy's own (gap 0), so
        such a micro-batch trains exactly as a colocated one."""
        cap = self.state.cfg.algorithm.offpolicy_is_cap
        gaps = version_gaps([s.policy_version for s in micro], self.version)
        if not any(gaps):
            self.offpolicy.add_unweighted(int(mask.sum()))
            return None
        dev = proximal.device
        behaviour = batch.scatter([s.rollout_log_probs for s in micro]).to(dev)
        gap = batch.scatter(
            [torch.full((s.response_ids.numel(),), float(g)) for s, g in zip(micro, gaps,
                                                                             strict=True)]
        ).to(dev)
        weight = is_weights(proximal, behaviour, gap, cap)
        self.offpolicy.add_weights(weight, mask, cap)
        return weight

    def _optimizer_step(self, step: int, stats: UpdateStats) -> None:
        """Clip, step (skipped on a non-finite norm), zero the gradients, advance the LR."""
        st = self.state
        grad_norm = torch.nn.utils.clip_grad_norm_(
            st.actor.parameters(), st.cfg.actor.max_grad_norm
        )
        gn = float(grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm)
        stats.grad_norms.append(gn)
        if torch.isfinite(torch.tensor(gn)):
            # The step runs where the parameters are: on the host with offloaded
            # parameters, whatever optimizer offload says.
            st.optimizer_state_to(params_home(st.cfg.actor, st.device))
            st.optimizer.step()
            st.optimizer_state_to(st.optimizer_home)
            stats.optimizer_steps += 1
        else:
            log.warning("step %d: non-finite grad norm, optimizer step skipped", step)
        st.optimizer.zero_grad(set_to_none=True)
        st.scheduler.step()

    def _update_metrics(self, samples: Sequence[Sample], stats: UpdateStats) -> dict[str, float]:
        """The step's update metrics: every rank's sums, all-reduced."""
        st, cfg = self.state, self.state.cfg
        diffs = [
            (s.old_log_probs - s.rollout_log_probs).abs()  # type: ignore[operator]
            for s in samples
            if s.rollout_log_probs.abs().sum() > 0
        ]
        gap = torch.cat(diffs) if diffs else torch.zeros(1)
        mine = float(self.forward_tokens)
        off = self.offpolicy
        off_sums = [float(getattr(off, k)) for k in OffpolicySums.SUMMED]
        reduced = self._all_sum([*stats.sums(), float(gap.sum()), float(gap.numel()), mine,
                                 *off_sums])
        n = len(UpdateStats._SUMMED)
        total = UpdateStats.from_sums(reduced[:n])
        gap_sum, gap_count, all_tokens = reduced[n : n + 3]
        most, least, *off_max = self._all_max(
            [mine, -mine, *(float(getattr(off, k)) for k in OffpolicySums.MAXED)])
        least = -least
        disaggregated = cfg.rollout.placement == "disaggregated"
        n_mb = cfg.actor.ppo_epochs * (cfg.samples_per_step // cfg.mini_batch_samples)
        grad_norms = stats.grad_norms  # this rank's: the norm is global already
        return {
            "actor/pg_loss": total.pg_loss / n_mb,
            "actor/kl": total.kl / n_mb,
            "actor/entropy": total.entropy / n_mb,
            "actor/clip_frac": total.clip_tokens / max(total.tokens, 1.0),
            "actor/dual_clip_frac": total.dual_clip_tokens / max(total.tokens, 1.0),
            "actor/grad_norm": sum(grad_norms) / max(len(grad_norms), 1),
            "actor/lr": float(st.scheduler.get_last_lr()[0]),
            "actor/optimizer_steps": total.optimizer_steps / st.world.size,
            "actor/micro_batches": total.micro_batches / st.world.size,
            "rollout/logprob_abs_diff_mean": gap_sum / max(gap_count, 1.0),
            # What the update's forwards processed (old, reference and new log-probs),
            # padding included, over all ranks; per rank, the most and the least, and
            # how far apart they are (the slowest rank sets the step's pace).
            "update/forward_tokens": all_tokens,
            "update/rank_tokens_max": most,
            "update/rank_tokens_min": least,
            "update/rank_tokens_spread": (most - least) / max(most, 1.0),
            # Colocated samples are always the updated policy's own: nothing to report.
            **(offpolicy_metrics(reduced[n + 3 :], off_max) if disaggregated else {}),
        }
