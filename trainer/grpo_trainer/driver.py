"""The single controller: Ray, the worker group, and the GRPO step loop.

Per step: prompts -> rollouts on every rank -> rewards (driver, parallel) ->
group advantages -> per-rank log-prob recomputation and update -> metrics,
progress report, checkpoint hook. Exceptions leave as ``StepError`` so the exit
code mapping knows the step.
"""

from __future__ import annotations

import logging
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from grpo_api.contract import STALLS_DIR
from grpo_api.trainer_config import Config

from .checkpointing.final_export import FinalExport, export_final
from .checkpointing.seam import Checkpointer, NoCheckpointer
from .config_error import ConfigError
from .data import PromptDataset, Record, StatefulLoader
from .errors import StepError, is_peer_loss
from .faults import allocate_until_killed, parse_fault, raise_injected_oom
from .liveness.progress import NullProgressReporter, Progress, ProgressReporter
from .liveness.sigterm import AttemptFiles, StepAbandoned, Terminated, TermSignal
from .liveness.stall import Heartbeat
from .liveness.stall_monitor import RankTarget, StallMonitor
from .liveness.watchdog import DetectorSettings, MemoryWatchdog, driver_memory, per_process_memory
from .metrics import MetricsLogger
from .nccl_log import Transport, combine, summary
from .placement import Gang, layout_for
from .rank_env import rank_env
from .rewards import RewardRunner, resolve_reward_fn
from .validation import Validator

log = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024
# How long a survivor's "peer died" waits for Ray to report the dead rank itself: Ray
# marks a node dead after its health checks fail (~15-30 s by default); a pod deleted
# gracefully is reported at once.
LOST_PEER_GRACE_S = 60.0


def init_ray(cfg: Config) -> bool:
    """Join a running cluster when there is one, else start a small local one.

    Returns True when this call started Ray (so the caller shuts it down).
    """
    import ray

    if ray.is_initialized():
        return False
    res = cfg.resources
    address = res.ray_address
    if address is None and (os.environ.get("RAY_ADDRESS") or _local_cluster_running()):
        address = "auto"
    if address and address != "local":
        ray.init(address=address, ignore_reinit_error=True)
        return True
    if res.nodes > 1:
        raise ConfigError(
            "resources.nodes",
            f"{res.nodes} nodes need a Ray cluster, but none is running here and a local Ray "
            "is one node: set resources.ray_address, or resources.nodes to 1",
        )
    # address="local": a Ray of our own; without it ray.init joins the cluster that
    # /tmp/ray/ray_current_cluster names (another run's) and refuses num_cpus.
    ray.init(
        address="local",
        num_cpus=max(2, int(res.num_workers * res.cpus_per_worker)),
        num_gpus=int(res.num_workers * res.gpus_per_worker) or None,
        object_store_memory=res.object_store_memory or LOCAL_OBJECT_STORE_BYTES,
        include_dashboard=False,
        ignore_reinit_error=True,
    )
    return True


def _local_cluster_running() -> bool:
    try:
        from ray._private.services import find_gcs_addresses

        return bool(find_gcs_addresses())
    except Exception:  # private API: absence just means "start our own"
        return False


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

    from .liveness.stall_monitor import RAY_POLL_S

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

        from .worker import Worker

        res = cfg.resources
        self.layout = layout_for(cfg)
        self.world_size = self.layout.world_size
        self.workers: list[Any] = []
        self.gang = Gang(self.layout, ranks_on_head=res.ranks_on_head)
        try:
            self.gang.reserve(res.gang_timeout_s)
            remote: Any = ray.remote(Worker)
            # Set before the actor's process loads CUDA or NCCL (rank_env.py).
            env = rank_env(res, cfg.trainer.attempt)
            extra = {"runtime_env": {"env_vars": env}} if env else {}
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

    def call(
        self, method: str, *per_rank_args: Sequence[Any], common: Sequence[Any] = ()
    ) -> list[Any]:
        refs = []
        for rank, w in enumerate(self.workers):
            args = [a[rank] for a in per_rank_args] + list(common)
            refs.append(getattr(w, method).remote(*args))
        return get_all(refs, self.watch)

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


def split(items: Sequence[Any], parts: int) -> list[list[Any]]:
    k = len(items) // parts
    return [list(items[i * k : (i + 1) * k]) for i in range(parts)]


class GRPOTrainer:
    def __init__(
        self,
        cfg: Config,
        *,
        reporter: ProgressReporter | None = None,
        checkpointer: Checkpointer | None = None,
        metrics: MetricsLogger | None = None,
    ) -> None:
        self.cfg = cfg
        self.reporter = reporter or NullProgressReporter()
        self.checkpointer = checkpointer or NoCheckpointer()
        self.fault = parse_fault(cfg.trainer.fault_inject)
        layout_for(cfg)  # a layout that cannot work is a config error, before Ray starts
        from .samples import prompt_token_counter

        # Prompts longer than data.max_prompt_length are dropped or refused here, before
        # Ray starts (data.overlong_prompts), counted as the ranks will encode them.
        prompt_tokens = prompt_token_counter(cfg)
        dataset = PromptDataset(cfg.data.train_files, cfg.data, prompt_tokens=prompt_tokens)
        self.total_steps = cfg.trainer.steps(len(dataset))
        self.metrics = metrics or MetricsLogger(cfg.metrics, self.total_steps,
                                                run_config=cfg.model_dump(mode="json"))
        self.loader = StatefulLoader(
            dataset, cfg.trainer.rollout_batch_size, cfg.data.seed, cfg.data.shuffle
        )
        self.rewards = RewardRunner(
            resolve_reward_fn(cfg.reward), cfg.reward.num_workers, cfg.reward.timeout_s
        )
        self.validator = Validator(cfg, self.total_steps, self.rewards, prompt_tokens)
        self.step = 0
        self.history: list[dict[str, float]] = []
        self.group: WorkerGroup | None = None
        self._reported_checkpoint: int | None = None
        self.heartbeat = Heartbeat(published=self.reporter.phase)
        self.term = TermSignal()
        wd = cfg.watchdog
        self.watchdog = (
            MemoryWatchdog(
                DetectorSettings(
                    wd.window_steps,
                    wd.warmup_steps,
                    wd.threshold_mib_per_step,
                    wd.min_positive_fraction,
                )
            )
            if wd.enabled
            else None
        )

    def start(self) -> None:
        self.group = WorkerGroup(self.cfg)
        self.step = self.checkpointer.restore(self.group, self.loader)

    def train_step(self) -> dict[str, float]:
        import torch

        from .grpo_math import group_advantages

        assert self.group is not None
        cfg = self.cfg
        step = self.step + 1
        t0 = time.perf_counter()
        records: list[Record] = self.loader.next_batch()
        world = self.group.world_size
        self.heartbeat.mark("rollout")  # weight sync into the engine, then generation
        outs = self.group.call("generate", split(records, world), common=[step])
        t_gen = time.perf_counter()
        if self.term.requested:  # before the update: the state is still the last step's
            raise StepAbandoned
        self.heartbeat.mark("reward")
        flat = [o for rank_out in outs for o in rank_out]
        by_index = {r.index: r for r in records}
        answers = [by_index[o["index"]].answer for o in flat]
        results = self.rewards.score([o["text"] for o in flat], answers)
        scores = torch.tensor([r.score for r in results])
        adv = group_advantages(scores, cfg.rollout.n, cfg.algorithm.norm_adv_by_std)
        t_rew = time.perf_counter()
        if self.fault == ("driver_cuda_oom", step):
            raise_injected_oom("driver", step)
        if self.fault == ("host_oom", step):
            allocate_until_killed(step)
        self.heartbeat.mark("update")  # old and reference log-probs, then the update
        per_rank = self.group.call("update", split(adv.tolist(), world), common=[step])
        upd = dict(per_rank[0])
        for key in upd:
            # The worst rank is the one that will OOM, the slowest sets the step's pace.
            if key.startswith(("memory/", "time/")):
                upd[key] = max(r[key] for r in per_rank)
        upd.update(per_process_memory(per_rank))  # memory/rank<r>/...: a leak has an address
        upd.update(driver_memory())
        t_end = time.perf_counter()

        resp = [o["response_tokens"] for o in flat]
        tokens = sum(o["prompt_tokens"] + o["response_tokens"] for o in flat)
        accs = [r.accuracy for r in results if r.accuracy is not None]
        elapsed = t_end - t0
        m: dict[str, float] = {
            "reward/mean": float(scores.mean()),
            "reward/std": float(scores.std()) if scores.numel() > 1 else 0.0,
            "reward/accuracy": statistics.fmean(accs) if accs else float("nan"),
            "reward/failed": float(sum(1 for r in results if r.failed)),
            "response/length_mean": statistics.fmean(resp),
            "response/length_max": float(max(resp)),
            "response/clip_ratio": 1.0 - statistics.fmean(float(o["finished"]) for o in flat),
            "time/step_s": elapsed,
            "time/rollout_s": t_gen - t0,
            "time/reward_s": t_rew - t_gen,
            # time/old_logprob_s, ref_logprob_s and update_s come from the ranks (upd)
            "throughput/samples_per_s": len(flat) / elapsed,
            "throughput/tokens_per_s": tokens / elapsed,
            **upd,
        }
        self.step = step
        return m

    def run(self) -> list[dict[str, float]]:
        if self.group is None:
            self.start()
        assert self.group is not None
        self.term.install()
        files = AttemptFiles.of(self.cfg)
        if files is not None:
            self.term.watch(files.stop)
        monitor = self._monitor()
        try:
            return self._run(monitor)
        finally:
            monitor.stop()
            self.term.restore()

    def _monitor(self) -> StallMonitor:
        from .errors import termination_log_path

        cfg = self.cfg
        stalls = Path(cfg.checkpoint.dir) / STALLS_DIR if cfg.checkpoint.dir else None
        targets: list[RankTarget] = getattr(self.group, "targets", [])
        monitor = StallMonitor(self.heartbeat, cfg.trainer.stall_timeout_s, targets, stalls,
                               cfg.trainer.attempt,
                               termination_log_path(cfg.trainer.termination_log),
                               self.checkpointer.latest_step)
        if hasattr(self.group, "watch"):  # Ray's group (the crash tests' local one: none)
            self.group.watch = monitor  # type: ignore[union-attr]
        self.heartbeat.mark("start")
        monitor.start()
        return monitor

    def _run(self, monitor: StallMonitor) -> list[dict[str, float]]:
        assert self.group is not None
        total = self.total_steps
        if self.step == 0:  # a fresh start: the baseline (validation.py; steps decide alone)
            try:
                if m0 := self.validator.maybe_run(self.group, 0):
                    self.metrics.log(0, m0)
            except Exception as err:
                raise StepError(0, err) from err
        while self.step < total and not self.term.requested:
            step = self.step + 1
            t_step = time.monotonic()
            position = self.loader.state_dict()
            try:
                m = self.train_step()
                self.heartbeat.mark("checkpoint")
                self.checkpointer.maybe_save(step, self.group, self.loader, final=step == total)
                if not self.term.requested:
                    self.heartbeat.mark("validation")
                    m.update(self.validator.maybe_run(self.group, step))  # after the save
            except StepAbandoned:
                self.loader.load_state_dict(position)  # the step is redone on resume
                log.warning("SIGTERM during step %d's rollout: the step is dropped", step)
                break
            except Exception as err:
                raise StepError(step, err) from err
            self.heartbeat.step_done(step, time.monotonic() - t_step)
            growth = None
            if self.watchdog is not None:
                m.update(self.watchdog.observe(m))
                growth = self.watchdog.message
            self.history.append(m)
            self.metrics.log(step, m)
            ckpt = self.checkpointer.latest_step()
            # The last step and a newly completed checkpoint skip the rate limit: the
            # operator records lastCheckpointStep in attempts[] when a pod dies.
            self.reporter.report(
                Progress(step, total, m["reward/mean"], ckpt, memory_growth=growth,
                         save_seconds=self.checkpointer.save_seconds(),
                         transport=self.group.transport, **self.validator.progress()),
                force=step == total or ckpt != self._reported_checkpoint,
            )
            self._reported_checkpoint = ckpt
        if self.term.requested and self.step < total:  # a finished run goes on to export
            self._save_and_stop()
        return self.history

    def _save_and_stop(self) -> None:
        """After SIGTERM: commit the last finished step unless it is, then stop (143)."""
        assert self.group is not None
        self.heartbeat.mark("checkpoint on SIGTERM")
        t0 = time.monotonic()
        try:
            saved = self.checkpointer.save_now(self.step, self.group, self.loader)
        except Exception as err:
            raise StepError(self.step, err) from err
        save_s = time.monotonic() - t0 if saved else None
        assert self.term.at is not None
        log.warning("SIGTERM: %s step %d, %.2f s after the signal%s",
                    "committed a checkpoint of" if saved else "nothing to save at",
                    self.step, time.monotonic() - self.term.at,
                    f" (the save took {save_s:.2f} s)" if save_s is not None else "")
        last = self.history[-1] if self.history else {}
        self.reporter.report(
            Progress(self.step, self.total_steps, last.get("reward/mean"),
                     self.checkpointer.latest_step(),
                     save_seconds=self.checkpointer.save_seconds(),
                     **self.validator.progress()),
            force=True,
        )
        raise StepError(self.step, Terminated(self.step, saved, save_s))

    def export_final(self) -> FinalExport | None:
        """After a finished run (checkpoint.export): the ranks stop, then the final
        checkpoint becomes a Hugging Face directory on rank 0's node (final_export.py)."""
        step = self.checkpointer.latest_step()
        if not self.cfg.checkpoint.export or self.cfg.checkpoint.dir is None or step is None:
            return None
        node = self.group.info[0].get("node_id") if self.group is not None else None
        if self.group is not None:
            self.group.shutdown()  # their host memory is what the export needs
            self.group = None
        return export_final(Path(self.cfg.checkpoint.dir), step, node)

    def close(self) -> None:
        self.rewards.close()
        self.metrics.close()
        if self.group is not None:
            self.group.shutdown()
            self.group = None
