"""The disaggregated rollout pipeline the driver steps through (``rollout.placement:
disaggregated``): the engines generate the batches of the next steps while the ranks
update on this one, each batch at most ``rollout.max_staleness`` policy versions behind
the update that trains it (routing.launch_through); staleness 0 is the colocated order,
sample for sample.

Per step ``t``: ``take(t)`` waits for batch ``t`` (an engine lost meanwhile is replaced
and its share generated again) and hands each rank its groups straight from the
engines' object stores; after the ranks' update, ``after_update(t)`` pushes policy ``t``
to the engines and launches the batches it may generate.

Checkpoints record the loader position of the first batch not yet trained
(``LoaderPosition``): batches in flight at a save are dropped, and a resumed run
generates them again with the restored weights.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpo_api.trainer_config import Config

from ..dataset import RowRef, StatefulLoader
from ..rank_api import RankApi
from ..rollout.engine_group import EngineGroup, is_lost
from ..rollout.routing import launch_through, route, split

if TYPE_CHECKING:
    from .worker_group import WorkerGroup

log = logging.getLogger(__name__)

# Times one batch's share may be generated again after its engine died.
MAX_REGENERATIONS = 3


@dataclass
class Batch:
    """One step's prompts in flight on the engines."""

    step: int
    records: list[RowRef]
    position: dict[str, int]  # the loader's position before this batch was drawn
    parts: list[list[RowRef]]  # per engine
    refs: list[tuple[Any, Any]] = field(default_factory=list)  # (summaries, samples)
    incarnation: list[int] = field(default_factory=list)  # of the engine given each part


class RolloutPipeline:
    def __init__(self, cfg: Config, ranks: WorkerGroup, engines: EngineGroup,
                 loader: StatefulLoader, total_steps: int, trained: int, timeout_s: float
                 ) -> None:
        """``ranks``: the worker group; ``engines``: started (loading), not connected;
        ``trained``: the steps already trained (the restored checkpoint's), the policy
        version the engines get first. Shuts the engines down if it fails."""
        self.cfg = cfg
        self.ranks = ranks
        self.loader = loader
        self.total = total_steps
        self.k = cfg.rollout.max_staleness
        self.engines = engines
        self.inflight: deque[Batch] = deque()
        self.trained = trained
        self.next_step = trained + 1
        self.reported_restarts = 0
        try:
            engines.connect(ranks.workers[0], ranks.call, timeout_s)
            self.engines.push(trained)
            self._fill()
        except BaseException:
            self.engines.shutdown()
            raise

    # -- launching -------------------------------------------------------------------
    def _fill(self) -> None:
        """Launch every batch the engines' policy (``trained``) may generate."""
        while self.next_step <= launch_through(self.trained, self.k, self.total):
            position = self.loader.state_dict()
            records = self.loader.next_batch()
            batch = Batch(self.next_step, records, position, split(records, self.engines.size))
            for e, part in enumerate(batch.parts):
                batch.refs.append(self.engines.generate(e, part, batch.step))
                batch.incarnation.append(self.engines.incarnation[e])
            self.inflight.append(batch)
            self.next_step += 1

    # -- one step --------------------------------------------------------------------
    def take(self, step: int) -> tuple[list[RowRef], list[list[dict[str, Any]]]]:
        """Batch ``step``'s records and each rank's sample summaries (in the order the
        rank holds the samples, which it has fetched when this returns)."""
        batch = self.inflight[0]
        if batch.step != step:
            raise RuntimeError(f"the pipeline holds step {batch.step}'s batch, not {step}'s")
        n = self.cfg.rollout.n
        for _ in range(MAX_REGENERATIONS):
            summaries = [self._collect(batch, e) for e in range(self.engines.size)]
            routes = route([len(s) // n for s in summaries], self.ranks.world_size)
            lost = sorted({e for held in self.ranks.call(
                RankApi.receive_samples, [[(e, batch.refs[e][1], a, b) for e, a, b in r]
                                    for r in routes]) for e in held})
            if not lost:
                outs = [[x for e, a, b in r for x in summaries[e][a * n : b * n]]
                        for r in routes]
                return batch.records, outs
            # Drawn, then lost with their engine's Ray node (its object store): the
            # summaries reached the driver, the samples never reached the ranks.
            for e in lost:
                log.warning("step %d: engine %d's samples were lost with its node",
                            batch.step, e)
                self._regenerate(batch, e)
        raise RuntimeError(f"step {step}: samples lost {MAX_REGENERATIONS} times")

    def _collect(self, batch: Batch, e: int) -> list[dict[str, Any]]:
        """Engine ``e``'s summaries of ``batch``: generated again on its replacement, with
        the current policy, when the engine died."""
        import ray

        for _ in range(MAX_REGENERATIONS):
            try:
                return list(ray.get(batch.refs[e][0]))
            except Exception as err:
                if not is_lost(err):
                    raise
                log.warning("rollout engine %d died during step %d's rollout: %s", e,
                            batch.step, str(err).splitlines()[0][:200])
            self._regenerate(batch, e)
        raise RuntimeError(f"step {batch.step}: engine {e}'s share failed "
                           f"{MAX_REGENERATIONS} times")

    def _regenerate(self, batch: Batch, e: int) -> None:
        """Engine ``e``'s share of ``batch`` drawn again, with the current policy: on a
        replacement when the engine that drew it is dead and not yet replaced."""
        if batch.incarnation[e] == self.engines.incarnation[e] and e in self.engines.dead():
            self.engines.replace([e])
            self.engines.push(self.trained)
        batch.refs[e] = self.engines.generate(e, batch.parts[e], batch.step)
        batch.incarnation[e] = self.engines.incarnation[e]

    def after_update(self, step: int) -> dict[str, float]:
        """Policy ``step`` to the engines, and the batches it may generate launched; the
        step's pipeline metrics."""
        t0 = time.perf_counter()
        self.inflight.popleft()
        self.trained = step
        self.engines.push(step)
        t_push = time.perf_counter() - t0
        self._fill()
        restarts = self.engines.restarts - self.reported_restarts
        self.reported_restarts = self.engines.restarts
        return {"rollout/engine_restarts": float(restarts),
                "rollout/batches_in_flight": float(len(self.inflight)),
                "time/weight_push_s": t_push}

    def first_untrained(self) -> dict[str, int]:
        """The loader position a checkpoint records: that of the first batch not yet
        trained (in flight, or the next to draw)."""
        return self.inflight[0].position if self.inflight else self.loader.state_dict()

    def shutdown(self) -> None:
        self.engines.shutdown()


class LoaderPosition:
    """What the checkpointer sees as the loader (``epoch``, ``state_dict``,
    ``load_state_dict``): the live loader's position, or, once the pipeline runs ahead,
    that of the first batch not yet trained."""

    def __init__(self, loader: StatefulLoader) -> None:
        self.loader = loader
        self.pipeline: RolloutPipeline | None = None

    @property
    def epoch(self) -> int:
        return int(self.state_dict()["epoch"])

    def state_dict(self) -> dict[str, int]:
        if self.pipeline is None:
            return self.loader.state_dict()
        return dict(self.pipeline.first_untrained())

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.loader.load_state_dict(state)
