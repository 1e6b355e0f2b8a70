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
from typing import Any

from grpo_api.trainer_config import Config

from .checkpointing.seam import Checkpointer, NoCheckpointer
from .data import PromptDataset, Record, StatefulLoader
from .errors import StepError, allocate_until_killed, parse_fault, raise_injected_oom
from .metrics import MetricsLogger
from .progress import NullProgressReporter, Progress, ProgressReporter
from .rewards import RewardRunner, resolve_reward_fn
from .validation import Validator
from .watchdog import DetectorSettings, MemoryWatchdog, driver_memory, per_process_memory

log = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_BYTES = 256 * 1024 * 1024


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
    ray.init(
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


def get_all(refs: Sequence[Any]) -> list[Any]:
    """``ray.get`` that fails fast: the first failed rank raises at once.

    With plain ``ray.get`` a rank that died would leave the others blocked in a
    collective and the driver waiting on them forever.
    """
    import ray

    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        ray.get(ready[0])  # raises the rank's error, if any
    return list(ray.get(list(refs)))


class WorkerGroup:
    """One Ray actor per FSDP rank."""

    def __init__(self, cfg: Config) -> None:
        import ray

        from .worker import Worker

        res = cfg.resources
        remote: Any = ray.remote(Worker)
        self.world_size = res.num_workers
        self.workers: list[Any] = [
            remote.options(num_cpus=res.cpus_per_worker, num_gpus=res.gpus_per_worker).remote(
                cfg, rank, self.world_size
            )
            for rank in range(self.world_size)
        ]
        addr, port = ray.get(self.workers[0].address.remote())
        self.info = get_all([w.setup.remote(addr, port) for w in self.workers])

    def call(
        self, method: str, *per_rank_args: Sequence[Any], common: Sequence[Any] = ()
    ) -> list[Any]:
        refs = []
        for rank, w in enumerate(self.workers):
            args = [a[rank] for a in per_rank_args] + list(common)
            refs.append(getattr(w, method).remote(*args))
        return get_all(refs)

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            ray.kill(w)


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
        dataset = PromptDataset(cfg.data.train_files, cfg.data)
        self.total_steps = cfg.trainer.steps(len(dataset))
        self.metrics = metrics or MetricsLogger(cfg.metrics, self.total_steps)
        self.loader = StatefulLoader(
            dataset, cfg.trainer.rollout_batch_size, cfg.data.seed, cfg.data.shuffle
        )
        self.rewards = RewardRunner(
            resolve_reward_fn(cfg.reward), cfg.reward.num_workers, cfg.reward.timeout_s
        )
        self.validator = Validator(cfg, self.total_steps, self.rewards)
        self.step = 0
        self.history: list[dict[str, float]] = []
        self.group: WorkerGroup | None = None
        self._reported_checkpoint: int | None = None
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
        outs = self.group.call("generate", split(records, world), common=[step])
        t_gen = time.perf_counter()
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
        total = self.total_steps
        if self.step == 0:  # a fresh start: the baseline (validation.py; steps decide alone)
            try:
                if m0 := self.validator.maybe_run(self.group, 0):
                    self.metrics.log(0, m0)
            except Exception as err:
                raise StepError(0, err) from err
        while self.step < total:
            step = self.step + 1
            try:
                m = self.train_step()
                self.checkpointer.maybe_save(step, self.group, self.loader, final=step == total)
                m.update(self.validator.maybe_run(self.group, step))  # after the save
            except Exception as err:
                raise StepError(step, err) from err
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
                         **self.validator.progress()),
                force=step == total or ckpt != self._reported_checkpoint,
            )
            self._reported_checkpoint = ckpt
        return self.history

    def close(self) -> None:
        self.rewards.close()
        self.metrics.close()
        if self.group is not None:
            self.group.shutdown()
            self.group = None
