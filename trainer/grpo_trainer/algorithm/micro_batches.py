"""Micro-batches by token budget (``actor.micro_batch_tokens``): a rank's samples, in
order, cut into contiguous micro-batches whose forward layout holds at most the budget.

A micro-batch's tokens are what its forward processes, padding included: rows x the
widest row, where a row is a run of samples sharing their prompt in the shared-prefix
layout (``packing.runs``: the prompt once, then each response; its width rounded up as
``collate_packed`` pads it, ``grpo_api.contract.packed_width``) or one sample in the
padded layout. That is what the activations, the attention mask and the time of a
micro-batch grow with, and what the planner's budget bounds (docs/memory-model.md,
"Micro-batches by tokens"). Samples stay in their order, so a group stays in as few
rows as the budget allows.

Every rank of an FSDP2 update must run the same number of forwards and backwards (each
one all-gathers and reduce-scatters with the others), so the ranks agree on the most any
of them needs (``PolicyUpdate``, an all-reduce) and each cuts its samples into exactly
that many, as evenly as their order allows (``split_evenly``).
"""

from __future__ import annotations

from grpo_api.contract import packed_width

from .packing import row_tokens, runs
from .samples import Sample


def _row_width(tokens: int, packed: bool) -> int:
    """A row of ``tokens`` as wide as its layout pads it."""
    return packed_width(tokens) if packed else tokens


def layout_tokens(samples: list[Sample], packed: bool) -> int:
    """Tokens of the forward that ``samples`` make: rows x the widest row (the packed
    width rounded up as ``collate_packed`` pads it)."""
    if not samples:
        return 0
    if not packed:
        return len(samples) * max(s.num_tokens for s in samples)
    rows = runs(samples)
    return len(rows) * packed_width(max(row_tokens(r) for r in rows))


def _greedy(samples: list[Sample], cap: int, packed: bool) -> list[list[Sample]]:
    """The fewest contiguous micro-batches of at most ``cap`` tokens each (a sample
    larger than ``cap`` alone). Greedy is optimal here: a micro-batch's tokens never
    shrink when a sample joins it."""
    out: list[list[Sample]] = []
    current: list[Sample] = []
    rows = width = run_width = 0
    for s in samples:
        p, r = s.prompt.input_ids.numel(), s.response_ids.numel()
        if packed and current and current[-1].prompt is s.prompt:
            n_rows, n_run = rows, run_width + r  # the row of its group grows
        else:
            n_rows, n_run = rows + 1, p + r
        n_width = max(width, n_run)
        if current and n_rows * _row_width(n_width, packed) > cap:
            out.append(current)
            current, n_rows, n_run, n_width = [], 1, p + r, p + r
        current.append(s)
        rows, run_width, width = n_rows, n_run, n_width
    if current:
        out.append(current)
    return out


def count_for_budget(samples: list[Sample], budget: int, packed: bool) -> int:
    """How many micro-batches of at most ``budget`` tokens ``samples`` need."""
    return len(_greedy(samples, budget, packed))


def split_evenly(samples: list[Sample], parts: int, packed: bool) -> list[list[Sample]]:
    """Exactly ``parts`` contiguous micro-batches (``parts`` <= len(samples)), the
    largest as small as their order allows: the least cap whose greedy cut needs no
    more than ``parts`` (bisected; the budget's own cut needs no more, so none exceeds
    the budget), then, while there are fewer, the largest micro-batch split in two."""
    if not 0 < parts <= len(samples):
        raise ValueError(f"cannot cut {len(samples)} samples into {parts} micro-batches")
    lo = max(layout_tokens([s], packed) for s in samples)
    hi = layout_tokens(samples, packed)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(_greedy(samples, mid, packed)) <= parts:
            hi = mid
        else:
            lo = mid + 1
    out = _greedy(samples, lo, packed)
    while len(out) < parts:
        i = max((j for j, mb in enumerate(out) if len(mb) > 1),
                key=lambda j: layout_tokens(out[j], packed))
        mb = out[i]
        cut = min(range(1, len(mb)), key=lambda c: max(layout_tokens(mb[:c], packed),
                                                       layout_tokens(mb[c:], packed)))
        out[i : i + 1] = [mb[:cut], mb[cut:]]
    return out
