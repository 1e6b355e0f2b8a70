"""The single controller: the GRPO step loop over the worker group
(``worker_group.WorkerGroup``) in the Ray the driver joined (``ray_bootstrap``).

Per step: prompts -> rollouts on every rank -> rewards (driver, parallel) ->
group advantages -> per-rank log-prob recomputation and update -> metrics,
progress report, checkpoint hook. With ``rollout.placement: disaggregated`` the rollouts
come from engines apart (rollout/pipeline.py), generated ahead within
``rollout.max_staleness``, and the new weights go to them after the update. Exceptions
leave as ``StepError`` so the exit code mapping knows the step.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any

from grpo_api.contract import STALLS_DIR, attempt_dir
from grpo_api.trainer_config import Config

from ..algorithm.balance import Plan, balance
from ..checkpointing.checkpointer import Checkpointer, NoCheckpointer
from ..checkpointing.final_export import FinalExport, export_final
from ..cluster.devices import job_collective_timeout_s
from ..cluster.placement import layout_for
from ..config import planned_peaks
from ..dataset import DrawCheck, PromptDataset, RowRef, StatefulLoader, sized_for_media
from ..errors import StepError
from ..faults import allocate_until_killed, parse_fault, raise_injected_oom
from ..liveness.progress import NullProgressReporter, Progress, ProgressReporter
from ..liveness.sigterm import AttemptFiles, StepAbandoned, Terminated, TermSignal
from ..liveness.stall import Heartbeat
from ..liveness.stall_monitor import StallMonitor
from ..liveness.watchdog import DetectorSettings, MemoryWatchdog, driver_memory, per_process_memory
from ..rank_api import RankApi, RankGroup
from ..rewards import extra_means, reward_rows, reward_runner, samples_for
from ..rollout.engine_group import EngineGroup
from ..rollout.routing import split
from .measured_peaks import PeakTracker
from .metrics import MetricsLogger
from .pipeline import LoaderPosition, RolloutPipeline
from .validation import Validator
from .worker_group import WorkerGroup

log = logging.getLogger(__name__)



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
        # status.progress.measuredPeaks, and the plan's beside them as metrics
        self.peaks = PeakTracker(cfg.trainer.attempt, planned_peaks(cfg))
        layout_for(cfg)  # a layout that cannot work is a config error, before Ray starts
        from ..algorithm.samples import prompt_token_counter

        # Prompts longer than data.max_prompt_length are dropped or refused here, before
        # Ray starts (data.overlong_prompts), counted as the ranks will encode them.
        prompt_tokens = prompt_token_counter(cfg)
        # The driver holds an index of the rows, not the rows (grpo_trainer.dataset): the
        # lengths are counted once across the CPUs and kept on the checkpoint volume.
        cache = Path(cfg.checkpoint.dir) if cfg.checkpoint.dir else None
        dataset = PromptDataset(cfg.data.train_files, cfg.data, prompt_tokens=prompt_tokens,
                                config=cfg, cache_dir=cache, report=self.reporter.stage_entered)
        self.total_steps = cfg.trainer.steps(len(dataset))
        self.metrics = metrics or MetricsLogger(cfg.metrics, self.total_steps,
                                                run_config=cfg.model_dump(mode="json"))
        self.bad_rows = dataset.bad_rows
        self.draw_check = DrawCheck(cfg.data, prompt_tokens) if dataset.lazy else None
        self.loader = StatefulLoader(
            dataset, cfg.trainer.rollout_batch_size, cfg.data.seed, cfg.data.shuffle,
            check=self.draw_check,
        )
        # What checkpoints record as the loader: with disaggregated rollouts running
        # ahead, the position of the first batch not yet trained (rollout/pipeline.py).
        self.position = LoaderPosition(self.loader)
        self.pipeline: RolloutPipeline | None = None
        self.rewards = reward_runner(cfg.reward)
        self.validator = Validator(cfg, self.total_steps, self.rewards, prompt_tokens, cache)
        # The ranks and engines get vLLM's image and video limits from the data (at most
        # the settings, each row limited to them at load).
        self.cfg = sized_for_media(cfg, dataset, *filter(None, [self.validator.dataset]))
        self.step = 0
        self.history: list[dict[str, float]] = []
        self.group: WorkerGroup | None = None
        self._reported_checkpoint: int | None = None
        self.heartbeat = Heartbeat(published=self.reporter.stage_entered)
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
        # Disaggregated: the engines load the model while the ranks start and restore,
        # then get the restored weights and loader position.
        engines = EngineGroup(self.cfg) if self.cfg.rollout.placement == "disaggregated" else None
        try:
            self.group = WorkerGroup(self.cfg)
            self.step = self.checkpointer.restore(self.group, self.position)
        except BaseException:
            if engines is not None:
                engines.shutdown()
            raise
        if engines is not None:
            self.pipeline = RolloutPipeline(self.cfg, self.group, engines, self.loader,
                                            self.total_steps, self.step,
                                            job_collective_timeout_s(
                                                self.cfg.model.path,
                                                self.cfg.resources.collective_timeout_s))
            self.position.pipeline = self.pipeline

    def train_step(self) -> dict[str, float]:
        import torch

        from ..algorithm.grpo_math import group_advantages

        assert self.group is not None
        cfg = self.cfg
        step = self.step + 1
        t0 = time.perf_counter()
        world = self.group.world_size
        times: dict[str, float] = {}  # time/rollout_s, time/reward_s
        records: list[RowRef]
        with self.heartbeat.stage("rollout", times):  # weight sync, then generation
            if self.pipeline is None:
                records = self.loader.next_batch()
                outs = self.group.call(RankApi.generate, split(records, world), common=[step])
            else:  # generated ahead by the engines (or now): the ranks fetch their samples
                records, outs = self.pipeline.take(step)
        if self.term.requested:  # before the update: the state is still the last step's
            raise StepAbandoned
        with self.heartbeat.stage("reward", times):
            flat = [o for rank_out in outs for o in rank_out]
            # The drawn rows' answer column (or every column, for a reward that reads
            # rows): all the driver reads of them.
            rows = reward_rows(records, cfg.data, self.rewards.reads_rows)
            results = self.rewards.score(samples_for(flat, rows))
            scores = torch.tensor([r.score for r in results])
            adv = group_advantages(scores, cfg.rollout.n, cfg.algorithm.norm_adv_by_std)
        if self.fault == ("driver_cuda_oom", step):
            raise_injected_oom("driver", step)
        if self.fault == ("host_oom", step):
            allocate_until_killed(step)
        # Old and reference log-probs, then the update: the ranks time its parts.
        with self.heartbeat.stage("update"):
            per_rank_adv, moved = self._balance(outs, adv.tolist())
            per_rank = self.group.call(RankApi.update, per_rank_adv, common=[step])
        upd = dict(per_rank[0])
        for key in upd:
            # The worst rank is the one that will OOM, the slowest sets the step's pace.
            if key.startswith(("memory/", "time/")):
                upd[key] = max(r[key] for r in per_rank)
        upd.update(per_process_memory(per_rank))  # memory/rank<r>/...: a leak has an address
        upd.update(driver_memory())
        if self.pipeline is not None:  # the new policy to the engines, the next batches
            with self.heartbeat.stage("weight push"):
                upd.update(self.pipeline.after_update(step))
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
            **extra_means(results, "reward/"),
            "response/length_mean": statistics.fmean(resp),
            "response/length_max": float(max(resp)),
            "response/clip_ratio": 1.0 - statistics.fmean(float(o["finished"]) for o in flat),
            "time/step_s": elapsed,
            **times,
            # time/old_logprob_s, ref_logprob_s and update_s come from the ranks (upd)
            "throughput/samples_per_s": len(flat) / elapsed,
            "update/groups_moved": float(moved),
            "data/bad_rows": float(self._bad_rows()),
            "throughput/tokens_per_s": tokens / elapsed,
            **upd,
        }
        self.step = step
        return m

    def _bad_rows(self) -> int:
        """Rows left out as unreadable (data.bad_rows: skip): at load, and when drawn."""
        return self.bad_rows + (self.draw_check.skipped if self.draw_check else 0)

    def _balance(self, outs: list[list[dict[str, Any]]], adv: list[float]
                 ) -> tuple[list[list[float]], int]:
        """Groups exchanged between ranks so that their update tokens are about equal
        (balance.py, ``actor.balance_ranks``); each rank's advantages, in the order of
        the samples it then holds, and how many groups moved."""
        assert self.group is not None
        n, world = self.cfg.rollout.n, self.group.world_size
        groups = [[o[i : i + n] for i in range(0, len(o), n)] for o in outs]
        costs = [[g[0]["prompt_tokens"] + sum(x["response_tokens"] for x in g) for g in mine]
                 for mine in groups]
        plan = (balance(costs) if self.cfg.actor.balance_ranks
                else Plan([[(r, g) for g in range(len(c))] for r, c in enumerate(costs)]))
        if plan.moved:
            handed = self.group.call(RankApi.hand_over, [plan.leaving(r) for r in range(world)])
            sent = {(r, g): group for r in range(world)
                    for g, group in zip(plan.leaving(r), handed[r], strict=True)}
            self.group.call(RankApi.take, [[sent[grp] for grp in plan.arriving(r)]
                                     for r in range(world)])
        start = [sum(len(o) for o in outs[:r]) for r in range(world)]
        return [[a for src, g in plan.ranks[r]
                 for a in adv[start[src] + g * n : start[src] + (g + 1) * n]]
                for r in range(world)], plan.moved

    def run(self) -> list[dict[str, float]]:
        if self.group is None:
            self.start()
        assert self.group is not None
        self.term.install()
        files = AttemptFiles.of(self.cfg)
        if files is not None:
            self.term.watch(files)
        monitor = self._monitor()
        try:
            return self._run(monitor)
        finally:
            monitor.stop()
            self.term.restore()

    def _generators(self) -> RankGroup:
        """Who generates validation responses: the ranks, or the disaggregated engines
        (with the weights pushed after the last update)."""
        assert self.group is not None
        return self.pipeline.engines if self.pipeline is not None else self.group

    def _monitor(self) -> StallMonitor:
        from ..liveness.termination import termination_log_path

        cfg = self.cfg
        stalls = (Path(attempt_dir(cfg.checkpoint.dir, cfg.trainer.attempt)) / STALLS_DIR
                  if cfg.checkpoint.dir else None)
        targets = self.group.targets if self.group is not None else []
        monitor = StallMonitor(self.heartbeat, cfg.trainer.stall_timeout_s, targets, stalls,
                               cfg.trainer.attempt,
                               termination_log_path(cfg.trainer.termination_log),
                               self.checkpointer.latest_step)
        if self.group is not None:
            self.group.watch = monitor
        self.heartbeat.mark("start")
        monitor.start()
        return monitor

    def _run(self, monitor: StallMonitor) -> list[dict[str, float]]:
        assert self.group is not None
        total = self.total_steps
        if self.step == 0:  # a fresh start: the baseline (validation.py; steps decide alone)
            try:
                if m0 := self.validator.maybe_run(self._generators(), 0):
                    self.metrics.log(0, m0)
            except Exception as err:
                raise StepError(0, err) from err
        while self.step < total and not self.term.requested:
            step = self.step + 1
            t_step = time.monotonic()
            position = self.position.state_dict()
            try:
                m = self.train_step()
                self.heartbeat.mark("checkpoint")
                self.checkpointer.maybe_save(step, self.group, self.position,
                                             final=step == total)
                if not self.term.requested:
                    self.heartbeat.mark("validation")
                    m.update(self.validator.maybe_run(self._generators(), step))  # after save
            except StepAbandoned:
                self.position.load_state_dict(position)  # the step is redone on resume
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
            self.metrics.log(step, m | self.peaks.planned_metrics())
            self.peaks.observe(step, m)
            ckpt = self.checkpointer.latest_step()
            # The last step and a newly completed checkpoint skip the rate limit: the
            # operator records lastCheckpointStep in attempts[] when a pod dies.
            self.reporter.report(
                Progress(step, total, m["reward/mean"], ckpt, memory_growth=growth,
                         save_seconds=self.checkpointer.save_seconds(),
                         transport=self.group.transport, bad_rows=self._bad_rows(),
                         measured_peaks=self.peaks.to_status(),
                         checkpoint_upload=self.checkpointer.upload_status(),
                         **self.validator.progress()),
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
            saved = self.checkpointer.save_now(self.step, self.group, self.position)
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
                     measured_peaks=self.peaks.to_status(),
                     checkpoint_upload=self.checkpointer.upload_status(),
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
        self._stop_engines()
        if self.group is not None:
            self.group.shutdown()  # their host memory is what the export needs
            self.group = None
        return export_final(Path(self.cfg.checkpoint.dir), step, node, self.cfg.checkpoint.store)

    def _stop_engines(self) -> None:
        if self.pipeline is not None:
            self.pipeline.shutdown()
            self.pipeline = None
            self.position.pipeline = None

    def close(self) -> None:
        self.rewards.close()
        self.metrics.close()
        self._stop_engines()
        if self.group is not None:
            self.group.shutdown()
            self.group = None
