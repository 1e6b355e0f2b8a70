"""What the driver calls on its ranks, as methods an editor (and mypy) can follow.

The driver reaches every rank through a group's ``call``: Ray actors
(``driver.worker_group.WorkerGroup``), in-process workers (the crash tests' ``LocalGroup``) or,
for validation, the rollout engines apart (``rollout.engine_group.EngineGroup``). Each
call names the method by the protocol's function (``group.call(RankApi.update, ...)``),
not by a string: "go to definition" lands here, next to what the method returns, and
``call`` returns that type for every rank. ``worker.Worker`` implements ``RankApi`` (mypy
checks it there); the groups call the method of that name on each rank.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

R = TypeVar("R")


class GreedyGenerator(Protocol):
    """Validation's one call: a rank's, or an engine's apart (engine_actor.py)."""

    def generate_greedy(self, chunks: Sequence[Sequence[Any]], step: int
                        ) -> list[dict[str, Any]]:
        """One greedy response per record (RowRef or Record), chunk by chunk."""
        ...


class RankApi(GreedyGenerator, Protocol):
    """Every rank's methods the driver and its checkpointer call, once per step or save."""

    def generate(self, records: Sequence[Any], step: int) -> list[dict[str, Any]]:
        """``rollout.n`` responses to each of the rank's records (RowRef or Record); the
        rank keeps the samples and returns their summaries."""
        ...

    def hand_over(self, groups: list[int]) -> list[list[Any]]:
        """The samples of the rank's ``groups`` that another rank updates on (balance.py)."""
        ...

    def take(self, groups: list[list[Any]]) -> None:
        """Samples handed over by other ranks, appended to the rank's own."""
        ...

    def update(self, advantages: list[float], step: int) -> dict[str, float]:
        """Old and reference log-probs, then the policy update; the rank's metrics."""
        ...

    def receive_samples(self, parts: list[tuple[int, Any, int, int]]) -> list[int]:
        """Disaggregated: the step's samples straight from the engines' object stores,
        ``(engine, samples ref, first group, end group)`` each; the engines whose samples
        were lost (the rank then holds nothing)."""
        ...

    def push_weights(self) -> dict[str, Any]:
        """Rank 0 sends the policy to the rollout engines apart; its report."""
        ...

    def save_checkpoint(self, path: str, async_save: bool = False) -> dict[str, Any]:
        """The rank's shard of a checkpoint into ``path``; how long the rank was blocked."""
        ...

    def finish_checkpoint(self, wait: bool = True) -> dict[str, Any] | None:
        """The save in flight on disk (``wait``), or whether it is yet."""
        ...

    def load_checkpoint(self, verify: dict[str, list[Any]], path: str) -> dict[str, Any]:
        """The rank's shard from ``path``, with the files ``verify`` names checked."""
        ...


class RankGroup(Protocol):
    """Every rank of a job behind one call (or every engine apart, for validation)."""

    @property
    def world_size(self) -> int:
        """Ranks (or engines) a call reaches."""
        ...

    def call(self, method: Callable[..., R], *per_rank_args: Sequence[Any],
             common: Sequence[Any] = ()) -> list[R]:
        """``method`` on every rank, each with its own item of every ``per_rank_args``
        and then ``common``; every rank's result, in rank order."""
        ...
