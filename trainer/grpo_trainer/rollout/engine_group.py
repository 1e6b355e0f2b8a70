"""The driver's hold on the disaggregated rollout engines: one Ray actor per engine
(engine_actor.py) on the nodes labelled RAY_SIDE_LABEL=rollout, placed as a gang of its
own; the weight group they share with rank 0 (weight_bus.py); the weight push after each
update; and the replacement of an engine whose process died.

A lost engine does not end the run: its actor is started again on its bundle, the weight
group is formed again for every member (rank 0 and all engines: a process group cannot
take a new member), the current weights are pushed to all, and whatever the dead engine
was generating is generated again (pipeline.py). A lost rank still ends the attempt.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from grpo_api.contract import RAY_SIDE_ROLLOUT
from grpo_api.trainer_config import Config

from ..cluster.devices import weight_sync_backend
from ..cluster.placement import Gang, engine_layout, side_labels
from ..cluster.rank_env import engine_env, runtime_env
from ..rank_api import R, RankApi
from .weight_bus import WeightGroupSpec

log = logging.getLogger(__name__)

# Pushes in a row that may each lose an engine before the run gives up: engines that
# keep dying are a broken node, not bad luck.
MAX_PUSH_TRIES = 3


def is_lost(err: BaseException) -> bool:
    """Whether a call failed because the engine's actor (its process, its node) died, or
    its result went with its node's object store."""
    from ray import exceptions as rex

    return isinstance(err, (rex.RayActorError, rex.NodeDiedError, rex.WorkerCrashedError,
                            rex.ObjectLostError))


def gather(refs: Sequence[Any]) -> tuple[dict[int, Any], list[int]]:
    """Each call's result by engine index, and the engines whose actor died on the way
    (any other failure is raised)."""
    import ray

    results: dict[int, Any] = {}
    dead: list[int] = []
    for index, ref in enumerate(refs):
        try:
            results[index] = ray.get(ref)
        except Exception as err:
            if not is_lost(err):
                raise
            dead.append(index)
    return results, dead


class EngineGroup:
    """The engines, their weight group with rank 0, and how many were replaced."""

    def __init__(self, cfg: Config) -> None:
        """Reserve the engines' gang and start them loading the model: the driver starts
        the ranks meanwhile, then ``connect``s the two."""
        import ray

        from .engine_actor import EngineWorker

        self.cfg = cfg
        self.rank0: Any = None
        self.rank_call: Callable[..., list[Any]] | None = None
        self.timeout_s = 0.0
        self.info: list[dict[str, Any]] = []
        self.layout = engine_layout(cfg)
        self.size = self.layout.world_size
        self.remote: Any = ray.remote(EngineWorker)
        # Set before the engine's process loads CUDA, NCCL or vLLM (rank_env.py).
        self.env = runtime_env(engine_env(cfg, cfg.trainer.attempt))
        self.engines: list[Any] = []
        self.incarnation = [0] * self.size  # bumped at each replacement
        self.restarts = 0
        self.version: int | None = None  # what every engine holds
        self.generation = 0  # the weight group's incarnation
        self.gang = Gang(self.layout, ranks_on_head=True,
                         labels=side_labels(cfg, RAY_SIDE_ROLLOUT))
        try:
            self.gang.reserve(cfg.resources.gang_timeout_s)
            self.engines = [self._start(e) for e in range(self.size)]
            self._loading = [e.setup.remote() for e in self.engines]
        except BaseException:
            self.shutdown()
            raise

    def connect(self, rank0: Any, rank_call: Callable[..., list[Any]], timeout_s: float
                ) -> None:
        """Once the engines have loaded: the weight group with ``rank0`` (rank 0's actor,
        which serves its store). ``rank_call``: the worker group's fail-fast ``call`` (a
        rank lost in a push ends the attempt); ``timeout_s``: the group's collectives'."""
        import ray

        self.rank0, self.rank_call, self.timeout_s = rank0, rank_call, timeout_s
        self.info = list(ray.get(self._loading))
        self.address, self.port = ray.get(rank0.open_weight_store.remote())
        self._form_group()
        log.info("rollout engines: %s", ", ".join(
            f"engine {i['index']} pid {i['pid']} on node {str(i['node_id'])[:8]} ({i['device']})"
            for i in self.info))

    def _start(self, index: int) -> Any:
        return self.remote.options(**self.gang.actor_options(index), **self.env).remote(
            self.cfg, index, self.incarnation[index])

    def backend(self) -> str:
        trainer = "cuda" if self.cfg.resources.trains_on_cuda else "cpu"
        engine = str(self.info[0]["device"]).split(":")[0] if self.info else "cpu"
        return weight_sync_backend(trainer, engine)

    def _form_group(self) -> None:
        """A new incarnation of the weight group: every member joins it (collective)."""
        import ray

        self.generation += 1
        spec = WeightGroupSpec(self.address, self.port, f"weights/{self.generation}",
                               self.size + 1, self.backend(), self.timeout_s)
        refs = [self.rank0.join_weight_group.remote(spec)]
        refs += [e.join_weight_group.remote(spec) for e in self.engines]
        ray.get(refs)

    def replace(self, indices: Sequence[int]) -> None:
        """Start the dead engines again and form the weight group again; the caller
        pushes the weights (every member's group is new)."""
        import ray

        for e in sorted(set(indices)):
            log.warning("rollout engine %d (pid %s) died: starting it again", e,
                        self.info[e].get("pid"))
            ray.kill(self.engines[e], no_restart=True)
            self.incarnation[e] += 1
            self.info[e] = self._restart(e)
            self.restarts += 1
        self._form_group()
        self.version = None

    def _restart(self, index: int) -> dict[str, Any]:
        """Engine ``index`` started again on its bundle and loaded. Its node may be dead
        and not yet known to be (Ray declares a node dead after missed health checks):
        an engine placed there dies before it runs, and is started again, on the node
        Ray places the bundle on next."""
        import ray

        for _ in range(MAX_PUSH_TRIES):
            self.engines[index] = self._start(index)
            try:
                return dict(ray.get(self.engines[index].setup.remote()))
            except Exception as err:
                if not is_lost(err):
                    raise
                log.warning("rollout engine %d died again while starting: %s", index,
                            str(err).splitlines()[0][:200])
        raise RuntimeError(f"rollout engine {index} died {MAX_PUSH_TRIES} times while starting")

    def dead(self) -> list[int]:
        """The engines whose actor died: a call each (answered once the calls queued
        before it are done, which the push would wait for anyway)."""
        return gather([e.info.remote() for e in self.engines])[1]

    def push(self, version: int) -> None:
        """The ranks' current weights (policy ``version``) into every engine; engines
        found dead on the way are replaced and the push repeated."""
        for _ in range(MAX_PUSH_TRIES):
            assert self.rank_call is not None, "push before connect"
            # An engine that died since its last call is replaced first: a broadcast to
            # a dead member fails at once on gloo but hangs until the timeout on NCCL.
            if found := self.dead():
                self.replace(found)
            receiving = [e.receive_weights.remote(version) for e in self.engines]
            sent = self.rank_call(RankApi.push_weights)[0]  # rank 0's report
            got, dead = gather(receiving)
            broken = not sent["ok"] or not all(r["ok"] for r in got.values())
            if not dead and not broken:
                self.version = version
                return
            if not dead:  # the broadcast failed with every engine alive: a real fault
                raise RuntimeError(f"weight broadcast to the rollout engines failed: "
                                   f"{sent.get('error', 'an engine broke off')}")
            self.replace(dead)
        raise RuntimeError(f"rollout engines kept dying during {MAX_PUSH_TRIES} weight pushes")

    @property
    def world_size(self) -> int:
        return self.size

    def call(self, method: Callable[..., R], *per_engine_args: Sequence[Any],
             common: Sequence[Any] = ()) -> list[R]:
        """``method`` on every engine (validation.py's group, as the ranks are colocated);
        engines lost on the way are started again, given the weights the others hold, and
        every engine is called again."""
        for _ in range(MAX_PUSH_TRIES):
            results, dead = gather([
                getattr(e, method.__name__).remote(*[a[i] for a in per_engine_args], *common)
                for i, e in enumerate(self.engines)])
            if not dead:
                return [results[i] for i in range(len(self.engines))]
            version = self.version
            self.replace(dead)
            if version is not None:
                self.push(version)
        raise RuntimeError(f"rollout engines kept dying during {MAX_PUSH_TRIES} calls of "
                           f"{method.__name__}")

    def generate(self, index: int, records: list[Any], step: int) -> tuple[Any, Any]:
        """Engine ``index``'s (summaries ref, samples ref) for ``records`` of ``step``."""
        summaries, samples = self.engines[index].generate.options(num_returns=2).remote(
            records, step)
        return summaries, samples

    def shutdown(self) -> None:
        import ray

        for e in self.engines:
            ray.kill(e, no_restart=True)
        self.engines = []
        self.gang.release()
