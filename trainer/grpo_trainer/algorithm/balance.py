"""The update's tokens spread evenly over the ranks: whole groups exchanged between ranks
after the rollout (``actor.balance_ranks``), pure.

Each rank generates for its own prompts, so its update gets those groups, and responses
of very different lengths leave one rank with far more tokens than another; the step
waits for the slowest. A group's cost is its row of the shared-prefix layout (the prompt
once and every response: ``prompt + sum(responses)`` tokens), what its forwards and
backwards grow with. Groups are exchanged one pair at a time between the most and the
least loaded rank, the pair whose difference comes closest to half their gap, until no
exchange makes the most loaded rank lighter: every rank keeps its number of groups (its
mini-batches and micro-batches stay aligned with the others'), and few groups move (the
driver hands each over once, through Ray).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .samples import Sample

Group = tuple[int, int]  # (the rank that generated it, its index among that rank's groups)


@dataclass(frozen=True)
class Plan:
    """Where each group trains: ``ranks[r]`` lists rank r's groups in training order (its
    own kept ones first, in their order, then those it receives)."""

    ranks: list[list[Group]]

    def leaving(self, rank: int) -> list[int]:
        """``rank``'s own groups that another rank trains, in index order."""
        return sorted(g for r, mine in enumerate(self.ranks) for src, g in mine
                      if src == rank and r != rank)

    def arriving(self, rank: int) -> list[Group]:
        return [grp for grp in self.ranks[rank] if grp[0] != rank]

    @property
    def moved(self) -> int:
        return sum(len(self.arriving(r)) for r in range(len(self.ranks)))


def balance(costs: list[list[int]], max_exchanges: int | None = None) -> Plan:
    """Groups exchanged until the most loaded rank cannot get lighter: ``costs[r][g]`` is
    the tokens of rank r's group g."""
    where: list[list[Group]] = [[(r, g) for g in range(len(c))] for r, c in enumerate(costs)]

    def cost(grp: Group) -> int:
        return costs[grp[0]][grp[1]]

    limit = max_exchanges if max_exchanges is not None else sum(len(c) for c in costs)
    for _ in range(limit):
        totals = [sum(cost(grp) for grp in mine) for mine in where]
        hi = max(range(len(where)), key=lambda r: totals[r])
        lo = min(range(len(where)), key=lambda r: totals[r])
        gap = totals[hi] - totals[lo]
        # The exchange moving d tokens (0 < d < gap) from hi to lo lowers the pair's
        # larger load to max(total_hi - d, total_lo + d): best at d nearest gap / 2.
        best = min(((i, j) for i, a in enumerate(where[hi]) for j, b in enumerate(where[lo])
                    if 0 < cost(a) - cost(b) < gap),
                   key=lambda ij: abs(gap - 2 * (cost(where[hi][ij[0]])
                                                 - cost(where[lo][ij[1]]))),
                   default=None)
        if best is None:
            break
        i, j = best
        where[hi][i], where[lo][j] = where[lo][j], where[hi][i]
    # Own groups first, in their order; then the arrivals, by origin.
    return Plan([sorted(mine, key=lambda grp: (grp[0] != r, grp)) for r, mine in enumerate(where)])


def hand_over(samples: list[Sample], groups: list[int], n: int
              ) -> tuple[list[Sample], list[list[Sample]]]:
    """``samples`` (groups of ``n``) without the ``groups`` that leave, in their order, and
    those groups. A leaving group's samples share one copy of their prompt without its
    decoded images and video frames (only the rollout engine reads them; the update reads
    the processor's tensors): pickled together, they arrive sharing it, so the receiving
    rank packs them into one row."""
    leaving = set(groups)
    kept = [s for i, s in enumerate(samples) if i // n not in leaving]
    out = []
    for g in groups:
        group = samples[g * n : (g + 1) * n]
        prompt = replace(group[0].prompt, images=[], videos=[])
        for s in group:
            s.prompt = prompt
        out.append(group)
    return kept, out
