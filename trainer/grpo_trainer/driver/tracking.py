"""Experiment trackers the driver logs each step's metrics to: Weights & Biases and MLflow.

One run per job: the operator renders the job's uid as `metrics.wandb.run_id` and
`metrics.mlflow.run_key`, so a restarted attempt resumes the run of the attempt before it.
A tracker is the user's convenience, not the job's purpose: one that fails to start or to
log is reported once on stderr and dropped, and training goes on (as with the progress
patches). Imported only when configured: wandb and MLflow take a second or two to import.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any, Protocol

from grpo_api.trainer_config import MlflowConfig, WandbConfig

log = logging.getLogger("grpo_trainer.driver.tracking")

RUN_KEY_TAG = "grpo.dev/run-key"  # the MLflow tag that finds a job's run again


class Tracker(Protocol):
    name: str

    def log(self, step: int, metrics: Mapping[str, float]) -> None: ...

    def close(self) -> None: ...


class WandbTracker:
    name = "wandb"

    def __init__(self, cfg: WandbConfig, run_config: Mapping[str, Any]) -> None:
        import wandb

        # console "off": the driver's stdout is the pod's log and its JSON lines, left as
        # they are; no system-stats sampler beside the ranks.
        settings = wandb.Settings(console="off", x_disable_stats=True, save_code=False)
        self.run = wandb.init(
            project=cfg.project, entity=cfg.entity, id=cfg.run_id, name=cfg.run_name,
            dir=cfg.dir, resume="allow" if cfg.run_id else None, config=dict(run_config),
            settings=settings,
        )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        # wandb keeps a run's steps increasing: a resumed attempt's replayed steps (those
        # after its checkpoint that the failed attempt had logged) are dropped by wandb.
        self.run.log(dict(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    name = "mlflow"

    def __init__(self, cfg: MlflowConfig, run_config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=cfg.tracking_uri)
        found = self.client.get_experiment_by_name(cfg.experiment)
        experiment = (found.experiment_id if found is not None
                      else self.client.create_experiment(cfg.experiment))
        earlier = self.client.search_runs(
            [experiment], filter_string=f"tags.`{RUN_KEY_TAG}` = '{cfg.run_key}'",
            max_results=1) if cfg.run_key else []
        if earlier:
            self.run_id = earlier[0].info.run_id
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            tags = {RUN_KEY_TAG: cfg.run_key} if cfg.run_key else {}
            self.run_id = self.client.create_run(experiment, run_name=cfg.run_name,
                                                 tags=tags).info.run_id
            # Parameters are write-once in MLflow: the config of the run's first attempt.
            params = [Param(k, str(v)[:6000]) for k, v in _flat(run_config).items()]
            for i in range(0, len(params), 100):  # MLflow's batch limit for params
                self.client.log_batch(self.run_id, params=params[i:i + 100])

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for k, v in metrics.items()
                 if math.isfinite(float(v))]
        self.client.log_batch(self.run_id, metrics=batch)

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _flat(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping):
            out |= _flat(value, f"{prefix}{key}.")
        elif value is not None:
            out[f"{prefix}{key}"] = value
    return out


def start_trackers(wandb: WandbConfig | None, mlflow: MlflowConfig | None,
                   run_config: Mapping[str, Any]) -> list[Tracker]:
    """The configured trackers that started; one that could not is logged and left out."""
    out: list[Tracker] = []
    for cls, cfg in ((WandbTracker, wandb), (MlflowTracker, mlflow)):
        if cfg is None:
            continue
        try:
            out.append(cls(cfg, run_config))  # type: ignore[arg-type]
        except Exception as err:  # any failure of a tracker's library
            log.warning("metrics.%s: not logging to %s: %s: %s", cls.name, cls.name,
                        type(err).__name__, err)
    return out


def call_each(trackers: list[Tracker], method: str, *args: Any) -> list[Tracker]:
    """Call `method` on each tracker; one that raises is logged and left out of the
    returned list (the ones to keep)."""
    kept = []
    for t in trackers:
        try:
            getattr(t, method)(*args)
        except Exception as err:  # any failure of a tracker's library
            log.warning("metrics.%s: %s failed, no longer logging to %s: %s: %s", t.name,
                        method, t.name, type(err).__name__, err)
            continue
        kept.append(t)
    return kept
