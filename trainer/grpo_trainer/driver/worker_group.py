"""The driver's hold on its remote ranks: the worker group (one Ray actor per rank, placed
as a gang), calls that fail fast when a rank dies and name the dead one, and what the
ranks report of NCCL's transport."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from grpo_api.contract import RAY_SIDE_TRAIN
from grpo_api.trainer_config import Config

from ..cluster.nccl_log import Transport, combine, summary
from ..cluster.placement import Gang, layout_for, side_labels
from ..cluster.rank_env import rank_env, runtime_env
from ..errors import is_peer_loss
from ..liveness.rank_crash import RankCrashed, fatal_crash
from ..liveness.stall_monitor import RankTarget
from ..rank_api import R

log = logging.getLogger(__name__)

# How long a survivor's "peer died" waits for Ray to report the dead rank itself: Ray
# marks a node dead after its health checks fail (~15-30 s by default); a pod deleted
# gracefully is reported at once.
LOST_PEER_GRACE_S = 60.0


class Watch(Protocol):
    """What a Ray wait reports to and asks of the stall monitor (stall_monitor.py)."""

    def waiting(self, ranks: list[int]) -> None: ...

    def check(self) -> None: ...


def get_all(refs: Sequence[Any], watch: Watch | None = None) -> list[Any]:
    """``ray.get`` that fails fast: the first failed rank raises at once.

    With plain ``ray.get`` a rank that died would leave the others blocked in a
    collective and the driver waiting on them forever. When a rank's process dies (its
    node lost, killed for memory), the survivors' collectives often fail first ("Connection
    closed by peer"); the dead rank's own error, which says why it died, arrives once Ray
    has noticed. So a peer-loss failure waits up to ``LOST_PEER_GRACE_S`` for a dead rank
    and raises that instead (RayOOM vs NodeLost depends on it); any other failure raises
    at once. With a ``watch``, the ranks still pending are reported to it and its
    verdict (a stall) raised while waiting.
    """
    import ray

    from ..liveness.stall_monitor import RAY_POLL_S

    pending = list(refs)
    while pending:
        if watch is not None:
            watch.waiting([r for r, ref in enumerate(refs) if ref in pending])
            watch.check()
        ready, pending = ray.wait(pending, num_returns=1,
                                  timeout=RAY_POLL_S if watch is not None else None)
        if not ready:
            continue
        failure: Exception | None = None
        try:
            ray.get(ready[0])  # raises the rank's error, if any
        except Exception as err:
            if isinstance(err, _lost_types()) or not is_peer_loss(err):
                raise  # a dead rank's own error, or no rank died: nothing to wait for
            failure = err
        if failure is None:
            continue
        t0 = time.monotonic()
        dead = _dead_rank(pending, LOST_PEER_GRACE_S)  # outside the handler: no context
        if dead is None:
            raise failure
        log.warning(
            "a rank's collective failed because a peer died (%s); %.1f s later Ray "
            "reported the dead rank: %s",
            str(failure).strip().splitlines()[-1][:200],
            time.monotonic() - t0,
            str(dead).splitlines()[0][:200],
        )
        raise dead
    return list(ray.get(list(refs)))


def _lost_types() -> tuple[type[BaseException], ...]:
    from ray import exceptions as rex

    return (rex.RayActorError, rex.NodeDiedError, rex.WorkerCrashedError)


def _dead_rank(pending: list[Any], grace_s: float) -> BaseException | None:
    """The first of ``pending`` that fails as a dead actor within ``grace_s``, if any."""
    import ray

    deadline = time.monotonic() + grace_s
    while pending and (left := deadline - time.monotonic()) > 0:
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        for ref in ready:
            try:
                ray.get(ref)
            except _lost_types() as err:
                return err
            except Exception:  # another survivor's failed collective
                continue
    return None


class WorkerGroup:
    """One Ray actor per FSDP rank, each on its bundle of its node's placement group.

    The gang (every node's group) is reserved before any actor starts, within
    ``resources.gang_timeout_s``; otherwise ``WorkersMissingError`` (exit 5) ends the
    attempt instead of ranks waiting in ``init_process_group`` for peers that never come.
    """

    def __init__(self, cfg: Config) -> None:
        import ray

        from ..rank.worker import Worker

        res = cfg.resources
        self.layout = layout_for(cfg)
        self.world_size = self.layout.world_size
        self.workers: list[Any] = []
        self.gang = Gang(self.layout, ranks_on_head=res.ranks_on_head,
                         labels=side_labels(cfg, RAY_SIDE_TRAIN),
                         first_labels=res.rank0_node_labels)
        try:
            self.gang.reserve(res.gang_timeout_s)
            remote: Any = ray.remote(Worker)
            # Set before the actor's process loads CUDA or NCCL (rank_env.py).
            extra = runtime_env(rank_env(res, cfg.trainer.attempt))
            self.workers = [
                remote.options(**self.gang.actor_options(p.rank), **extra).remote(
                    cfg, p.rank, self.world_size, p.local_rank
                )
                for p in self.layout.places
            ]
            addr, port = ray.get(self.workers[0].open_rendezvous.remote())
            self.info = get_all([w.setup.remote(addr, port) for w in self.workers])
            self.transport = transport_report(self.info, cfg.trainer.attempt)
            armed = get_all([w.arm_signals.remote() for w in self.workers])
        except BaseException:
            self.shutdown()  # the caller never gets a group to close
            raise
        self.targets = [RankTarget(r, a["pid"], a["node_id"], a["stacks_file"])
                        for r, a in enumerate(armed)]
        # Where to look by hand (py-spy dump --pid, gdb) should a rank misbehave.
        log.info("ranks: %s", ", ".join(f"rank {t.rank} pid {t.pid} on node {t.node_id}"
                                        for t in self.targets))
        self.watch: Watch | None = None

    def call(self, method: Callable[..., R], *per_rank_args: Sequence[Any],
             common: Sequence[Any] = ()) -> list[R]:
        """``method`` (a ``RankApi`` function) on every rank's actor: rank_api.RankGroup."""
        refs = []
        for rank, w in enumerate(self.workers):
            args = [a[rank] for a in per_rank_args] + list(common)
            refs.append(getattr(w, method.__name__).remote(*args))
        try:
            return get_all(refs, self.watch)
        except _lost_types() as err:
            crashed = self.crash_of(err)
            if crashed is None:
                raise
            log.error("%s", crashed)
            raise crashed from err

    def crash_of(self, err: BaseException) -> RankCrashed | None:
        """A ``RankCrashed`` if the rank whose actor ``err`` reports dead wrote a
        fatal-signal dump as it died (rank_crash.py), else None: a process killed
        outright, or a node gone with its files, stays a lost rank."""
        from ..liveness.stall_monitor import read_stacks_files

        dead = getattr(err, "actor_id", None)
        ranks = [r for r, w in enumerate(self.workers) if w._actor_id.hex() == dead]
        targets = [t for t in self.targets if t.rank in ranks]
        files = {t.rank: t.stacks_file for t in targets}
        for found in read_stacks_files(targets) if targets else []:
            crash = fatal_crash(found.text or "")
            if crash is not None:
                return RankCrashed(crash.message(found.rank, files[found.rank]))
        return None

    def shutdown(self) -> None:
        """Kill every rank now (ranks on surviving nodes may sit in a collective waiting
        for a dead peer: nobody waits for them) and release the reserved bundles."""
        import ray

        for w in self.workers:
            ray.kill(w, no_restart=True)
        self.workers = []
        self.gang.release()


def transport_report(info: Sequence[dict[str, Any]], attempt: int) -> dict[str, Any] | None:
    """status.progress.transport from every rank's parsed NCCL lines (None: not logged,
    as on a CPU rank or a later attempt); the job's one line goes to the log."""
    reports = [Transport(r["network"], tuple(r["intraNode"]), bool(r["interNode"]),
                         tuple(r["causes"]))
               for r in (i.get("transport") for i in info) if r]
    if not reports:
        return None
    job = combine(reports)
    log.info("transport: %s", summary(job))
    return {**job.to_dict(), "attempt": attempt}
