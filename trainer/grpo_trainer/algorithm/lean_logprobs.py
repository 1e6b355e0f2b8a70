"""The update's log-probs without the full logits (docs/memory-model.md, "Logits").

``model(...)`` would apply the LM head to every position of the padded sequence and
hand back ``[batch, sequence, vocabulary]`` logits; the float32 temperature-scaled copy,
its log-softmax and the entropy's softmax then cost ~30 bytes per token per vocabulary
entry, prompt included. Here the head is swapped, for one forward, for a function that
takes the decoder's last hidden states at the response positions only and runs the head,
the temperature, the log-softmax and the entropy ``chunk`` tokens at a time
(``ChunkedHead``): two float32 ``[chunk, vocabulary]`` buffers at any moment, in forward
and in backward, which recomputes each chunk's logits instead of keeping them.

The swap happens inside the model's own forward, so FSDP2 has the root unit (embeddings,
LM head) gathered exactly as for the plain head: the actor's root stays gathered for
backward, the reference's is resharded after its forward. Qwen2, Qwen3 and Qwen2/2.5/3-VL
in transformers 5 call ``self.lm_head(hidden_states[:, slice_indices, :])`` and put the
result in ``out.logits`` untouched, which is all this relies on; LoRA never adapts the
head. ``full_logits_log_probs`` is the plain path, kept as the reference the tests and
``bench/bench_logprobs.py`` compare against.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .grpo_math import entropy_from_logits, log_probs_from_logits
from .samples import TrainBatch

LOGP, ENTROPY = 0, 1  # columns of ChunkedHead's output
LSE, MEAN_Z = 0, 1  # columns of backward's per-token statistics (_weight_grad_by_vocab)


def _scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """``hidden @ weight.T / temperature`` in float32. The head runs in the compute dtype,
    as ``nn.Linear`` does on the plain path; its output is freed once scaled, so the chunk
    never holds it beside two float32 buffers."""
    logits = F.linear(hidden, weight)
    z = torch.empty(logits.shape, dtype=torch.float32, device=logits.device)
    # Copied, then divided in float32 (torch.div(..., out=z) would divide in bf16).
    return z.copy_(logits).div_(temperature)


def _chunk_forward(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float,
    out: torch.Tensor,
) -> None:
    """One chunk's log p(label) and entropy into ``out`` ([c, 1] or [c, 2]), in the
    order of operations of ``grpo_math.log_probs_from_logits`` (torch.logsumexp's)."""
    z = _scaled_logits(hidden, weight, temperature)
    picked = z.gather(1, labels.unsqueeze(1))
    top = z.amax(dim=1, keepdim=True)
    z.sub_(top)  # z' = z - max: exp cannot overflow
    p = z.exp()
    total = p.sum(dim=1, keepdim=True)
    p.div_(total)
    log_total = total.log_()
    out[:, LOGP : LOGP + 1] = picked - (log_total + top)  # log-sum-exp of z
    if out.shape[1] > ENTROPY:
        # H = logsumexp(z) - E_p[z] = log(total) - E_p[z'], the expectation as a
        # batched dot product (no third [c, V] buffer for p * z').
        expected = torch.bmm(p.unsqueeze(1), z.unsqueeze(2)).view(-1, 1)
        out[:, ENTROPY : ENTROPY + 1] = log_total - expected


def _chunk_grad_logits(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float,
    g_logp: torch.Tensor, g_entropy: torch.Tensor | None, stats: torch.Tensor | None = None,
) -> torch.Tensor:
    """d(loss)/d(logits) of one chunk, in the head's dtype, from the logits recomputed;
    with ``stats`` ([c, 2] float32), each token's log-sum-exp of the scaled logits and
    (with ``g_entropy``) their mean under p, for ``_weight_grad_by_vocab``.

    With z the scaled logits and p = softmax(z): d log p_l / dz = onehot(l) - p and
    dH / dz = -p (z - E_p[z]); the temperature divides both on the way to the logits."""
    z = _scaled_logits(hidden, weight, temperature)
    top = z.amax(dim=1, keepdim=True)
    z.sub_(top)
    p = z.exp()
    total = p.sum(dim=1, keepdim=True)
    p.div_(total)
    if stats is not None:
        torch.log(total, out=stats[:, LSE : LSE + 1]).add_(top)
    del total
    if g_entropy is not None:
        expected = torch.bmm(p.unsqueeze(1), z.unsqueeze(2)).view(-1, 1)
        if stats is not None:
            torch.add(expected, top, out=stats[:, MEAN_Z : MEAN_Z + 1])
        z.sub_(expected).mul_(p).mul_(g_entropy.unsqueeze(1))  # g_H dH/dz, sign below
        del expected
        p.mul_(g_logp.unsqueeze(1)).add_(z)  # g_lp p + g_H p (z - E z)
        del z
    else:
        del z
        p.mul_(g_logp.unsqueeze(1))
    p.neg_().scatter_add_(1, labels.unsqueeze(1), g_logp.unsqueeze(1))
    p.div_(temperature)
    return p.to(weight.dtype)


def _weight_grad_by_vocab(
    hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float,
    g_logp: torch.Tensor, g_entropy: torch.Tensor | None, stats: torch.Tensor, rows: int,
    out: torch.Tensor,
) -> None:
    """The head's weight gradient into ``out``, ``rows`` vocabulary rows at a time, each
    slice one matmul over every response token: summed in the matmul's float32 and
    rounded once, as the plain path's one matmul is, where summing the chunks' products
    in bf16 rounds once per chunk (tests/unit/test_head_gradient.py: 128 chunks strayed
    about 1% from the one matmul's gradient, this under 0.01%). The same d(loss)/d(logits) as
    ``_chunk_grad_logits``, p from each token's log-sum-exp in ``stats``."""
    lse = stats[:, LSE : LSE + 1]
    for v0 in range(0, weight.shape[0], rows):
        z = _scaled_logits(hidden, weight[v0 : v0 + rows], temperature)  # [N, rows]
        if g_entropy is not None:
            p = z.sub(lse).exp_()
            z.sub_(stats[:, MEAN_Z : MEAN_Z + 1]).mul_(p).mul_(g_entropy.unsqueeze(1))
            p.mul_(g_logp.unsqueeze(1)).add_(z)  # g_lp p + g_H p (z - E z)
            del z
        else:
            p = z.sub_(lse).exp_().mul_(g_logp.unsqueeze(1))
            del z  # p itself: freed with it
        # The one-hot term of the tokens whose label is in the slice; the others add 0
        # (no index of them taken: no device sync).
        col = labels - v0
        mine = (col >= 0) & (col < p.shape[1])
        p.neg_().scatter_add_(1, col.clamp_(0, p.shape[1] - 1).unsqueeze(1),
                              (g_logp * mine).unsqueeze(1))
        del col, mine
        p.div_(temperature)
        grad = p.to(weight.dtype)
        del p
        torch.mm(grad.t(), hidden, out=out[v0 : v0 + rows])
        del grad  # before the next slice's buffers


class ChunkedHead(torch.autograd.Function):
    """``[N, k]`` float32 log-probs of ``labels`` (column 0) and, with ``entropy``, the
    entropy (column 1) of ``softmax(hidden @ weight.T / temperature)``, ``chunk`` rows
    at a time; backward recomputes each chunk. ``entropy_grad`` False: the entropy is a
    metric, its column takes no gradient (whatever arrives for it is ignored)."""

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
        temperature: float, chunk: int, entropy: bool, entropy_grad: bool,
    ) -> torch.Tensor:
        n = hidden.shape[0]
        out = torch.empty((n, 2 if entropy else 1), dtype=torch.float32, device=hidden.device)
        for s in range(0, n, chunk):
            _chunk_forward(hidden[s : s + chunk], weight, labels[s : s + chunk], temperature,
                           out[s : s + chunk])
        ctx.save_for_backward(hidden, weight, labels)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.entropy_grad = entropy and entropy_grad
        return out

    @staticmethod
    def backward(
        ctx: Any, grad_out: torch.Tensor
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, labels = ctx.saved_tensors
        want_hidden, want_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        # The head's whole gradient in its own dtype, as the plain path's single matmul
        # leaves it (the planner counts it among FSDP2's buffers, planner/fsdp.py). Over
        # several chunks below float32 it is made after the token chunks, by vocabulary
        # slices (_weight_grad_by_vocab): rounded once, not once per chunk. The tokens'
        # statistics it needs are the planner's (sizes.logprob_bytes).
        n = hidden.shape[0]
        by_vocab = want_weight and n > ctx.chunk and weight.dtype != torch.float32
        grad_weight = None
        if want_weight:
            grad_weight = torch.empty_like(weight) if by_vocab else torch.zeros_like(weight)
        stats = (torch.empty((n, 2), dtype=torch.float32, device=hidden.device)
                 if by_vocab else None)
        g_entropy_all = grad_out[:, ENTROPY] if ctx.entropy_grad else None
        for s in range(0, n, ctx.chunk):
            h = hidden[s : s + ctx.chunk]
            dlogits = _chunk_grad_logits(
                h, weight, labels[s : s + ctx.chunk], ctx.temperature,
                grad_out[s : s + ctx.chunk, LOGP],
                None if g_entropy_all is None else g_entropy_all[s : s + ctx.chunk],
                None if stats is None else stats[s : s + ctx.chunk],
            )
            if grad_hidden is not None:
                torch.mm(dlogits, weight, out=grad_hidden[s : s + ctx.chunk])
            if grad_weight is not None and not by_vocab:
                grad_weight.addmm_(dlogits.t(), h)
            del dlogits
        if grad_weight is not None and stats is not None:
            # As many vocabulary rows for all n tokens as a chunk's tokens take.
            rows = max(1, ctx.chunk * weight.shape[0] // n)
            _weight_grad_by_vocab(hidden, weight, labels, ctx.temperature, grad_out[:, LOGP],
                                  g_entropy_all, stats, rows, grad_weight)
        return grad_hidden, grad_weight, None, None, None, None, None


@dataclass(frozen=True)
class ResponseIndex:
    """Where a batch's response tokens are: ``hidden`` indexes the forward's flattened
    ``[B * L]`` positions whose hidden state predicts them, ``out`` the flattened
    ``[rows * T]`` layout of ``TrainBatch.labels``, in the same order."""

    hidden: torch.Tensor
    out: torch.Tensor


def response_index(batch: TrainBatch) -> ResponseIndex:
    """The response positions of ``batch`` (right-padded or shared-prefix packed)."""
    width = batch.labels.shape[1]
    spans = [row * width + torch.arange(start, start + n) for row, start, n in batch.positions]
    out = torch.cat(spans) if spans else torch.zeros(0, dtype=torch.long)
    if batch.logit_index is not None:  # packed: one row, logit_index maps T to [B * L]
        return ResponseIndex(batch.logit_index[out], out)
    seq = batch.model_inputs["input_ids"].shape[1]
    # collate_train: label t of a row is predicted at position t (logits[:, :-1]).
    hidden = torch.cat([row * seq + torch.arange(start, start + n)
                        for row, start, n in batch.positions]) if spans else out
    return ResponseIndex(hidden, out)


@contextmanager
def _head_swapped(model: nn.Module, head_fn: Any) -> Iterator[None]:
    """``model``'s LM head computes ``head_fn(head, hidden)`` for the duration (an
    instance attribute shadows ``nn.Linear.forward``)."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if get_head is not None else None
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise TypeError(f"{type(model).__name__}: no bias-free nn.Linear LM head to chunk")
    head.forward = lambda hidden: head_fn(head, hidden)
    try:
        yield
    finally:
        del head.forward


@dataclass(frozen=True)
class LogProbs:
    """Per-token ``[rows, T]`` float32 log-probs (and entropy), 0 off the response."""

    logp: torch.Tensor
    entropy: torch.Tensor | None


def _placed(values: torch.Tensor, index: ResponseIndex, shape: torch.Size) -> torch.Tensor:
    full = values.new_zeros(shape.numel())
    return full.index_copy(0, index.out.to(values.device), values).view(shape)


def lean_log_probs(
    model: nn.Module, inputs: dict[str, torch.Tensor], batch: TrainBatch, *,
    temperature: float, chunk: int, entropy: bool, entropy_grad: bool,
) -> LogProbs:
    """``model``'s log-probs of ``batch``'s response tokens (``inputs`` are its model
    inputs on the device), the head chunked; ``entropy_grad`` makes the entropy carry a
    gradient (an entropy bonus in the loss), else it is a metric."""
    index = response_index(batch)
    labels = batch.labels.reshape(-1)[index.out]
    result: dict[str, torch.Tensor] = {}

    def head_fn(head: nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
        flat = hidden.reshape(-1, hidden.shape[-1])
        picked = flat.index_select(0, index.hidden.to(flat.device))
        out = ChunkedHead.apply(picked, head.weight, labels.to(flat.device), temperature,
                                chunk, entropy, entropy_grad)
        result["out"] = out
        return out  # becomes out.logits: FSDP2 hooks the root's backward on it

    with _head_swapped(model, head_fn):
        model(**inputs, use_cache=False)
    out = result["out"]
    shape = batch.labels.shape
    ent = None
    if entropy:
        column = out[:, ENTROPY]
        ent = _placed(column if entropy_grad else column.detach(), index, shape)
    return LogProbs(_placed(out[:, LOGP], index, shape), ent)


def full_logits_log_probs(
    model: nn.Module, inputs: dict[str, torch.Tensor], batch: TrainBatch, *,
    temperature: float, entropy: bool, entropy_grad: bool,
) -> LogProbs:
    """The plain path, as the update ran before the chunked head: the whole sequence's
    logits, a float32 temperature-scaled copy, log-softmax and entropy over all of it.
    The reference for the chunked head's numerics and memory (tests, bench)."""
    out = model(**inputs, use_cache=False)
    logits = batch.response_logits(out.logits).float() / temperature
    logp = log_probs_from_logits(logits, batch.labels.to(logits.device))
    ent = None
    if entropy:
        if entropy_grad:
            ent = entropy_from_logits(logits)
        else:
            with torch.no_grad():
                ent = entropy_from_logits(logits.detach())
    return LogProbs(logp, ent)
