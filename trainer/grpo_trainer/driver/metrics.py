"""Per-step metrics: JSON lines on stdout, TensorBoard, Prometheus, a progress bar, and
the experiment trackers of spec.logging (tracking.py: Weights & Biases, MLflow).

Every sink is optional and cheap when off; the driver calls ``log(step, metrics)``
once per step (and at step 0 for the before-training validation pass, its ``val/``
metrics only) and ``close()`` at the end.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from grpo_api.trainer_config import MetricsConfig

from .tracking import Tracker, call_each, start_trackers


def _finite(v: float) -> float | None:
    return v if math.isfinite(v) else None


# memory/<process>/<name> (the watchdog's per-process series) -> one Prometheus gauge
# grpo_process_<name> with a process="driver"|"rank<r>" label.
_PER_PROCESS = re.compile(r"^memory/(driver|rank\d+)/(\w+)$")


class MetricsLogger:
    def __init__(self, cfg: MetricsConfig, total_steps: int, stream: TextIO | None = None,
                 run_config: Mapping[str, Any] | None = None) -> None:
        """``run_config``: the whole trainer config, recorded with a tracker's run."""
        self.cfg = cfg
        self.total_steps = total_steps
        self.stream = stream or sys.stdout
        self._tb: Any = None
        self._gauges: dict[str, Any] = {}
        self._labelled: dict[str, Any] = {}
        self._registry: Any = None
        self._progress: Any = None
        self._task: Any = None
        if cfg.tensorboard_dir:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(cfg.tensorboard_dir)
        if cfg.prometheus_port is not None:
            from prometheus_client import CollectorRegistry, start_http_server

            self._registry = CollectorRegistry()
            start_http_server(cfg.prometheus_port, registry=self._registry)
        self._trackers: list[Tracker] = start_trackers(cfg.wandb, cfg.mlflow, run_config or {})
        show = cfg.progress_bar == "on" or (cfg.progress_bar == "auto" and self.stream.isatty())
        if show:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("GRPO"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} {task.fields[info]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._progress.start()
            self._task = self._progress.add_task("train", total=total_steps, info="")

    def _gauge(self, name: str) -> Any:
        if name not in self._gauges:
            from prometheus_client import Gauge

            safe = "grpo_" + "".join(c if c.isalnum() else "_" for c in name)
            self._gauges[name] = Gauge(safe, f"GRPO trainer metric {name}", registry=self._registry)
        return self._gauges[name]

    def _process_gauge(self, name: str) -> Any:
        if name not in self._labelled:
            from prometheus_client import Gauge

            self._labelled[name] = Gauge(
                f"grpo_process_{name}",
                f"GRPO trainer per-process metric {name}",
                ["process"],
                registry=self._registry,
            )
        return self._labelled[name]

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        if self.cfg.jsonl:
            record = {"step": step, **{k: _finite(float(v)) for k, v in metrics.items()}}
            # Progress bar and JSON lines share the terminal; rich prints above the bar.
            line = json.dumps(record)
            if self._progress is not None:
                self._progress.console.print(line, markup=False, highlight=False)
            else:
                print(line, file=self.stream, flush=True)
        if self._tb is not None:
            for k, v in metrics.items():
                self._tb.add_scalar(k, float(v), step)
        if self._registry is not None:
            self._gauge("step").set(step)
            for k, v in metrics.items():
                if m := _PER_PROCESS.match(k):
                    self._process_gauge(m.group(2)).labels(process=m.group(1)).set(float(v))
                else:
                    self._gauge(k).set(float(v))
        self._trackers = call_each(self._trackers, "log", step, metrics)
        if self._progress is not None:
            info = f"reward={metrics.get('reward/mean', float('nan')):.3f}"
            if "val/reward_mean" in metrics:  # a validation step (validation.py)
                info += f" val={metrics['val/reward_mean']:.3f}"
            self._progress.update(self._task, completed=step, info=info)

    def close(self) -> None:
        self._trackers = call_each(self._trackers, "close")
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()
        if self._progress is not None:
            self._progress.stop()
