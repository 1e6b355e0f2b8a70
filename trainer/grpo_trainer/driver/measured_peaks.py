"""The attempt's highest memory readings, in the plan's shape (grpo_api.job.memory_peaks):
what the driver reports as ``status.progress.measuredPeaks`` for the MemoryPlan
condition, and the plan's own figures as metrics beside them (the dashboard's
"measured vs planned"). Pure: it reads a step's metrics (each ``memory/`` key already the
worst rank's) and keeps the maxima."""

from __future__ import annotations

from collections.abc import Mapping

from grpo_api.job.memory_peaks import MeasuredPeaks, MemoryPeaks

GIB = 2**30
# A step's metric -> where it goes in MeasuredPeaks (the GPU keys only on a GPU rank).
GPU_READINGS = {
    "rollout": "memory/gpu_rollout_card_peak_bytes",
    "training": "memory/gpu_training_card_peak_bytes",
}
RANK_RSS = "memory/host_rss_bytes"
DRIVER_RSS = "memory/driver/host_rss_bytes"


class PeakTracker:
    """The maxima of this attempt's step readings; ``peaks`` is None before the first."""

    def __init__(self, attempt: int, planned: MemoryPeaks | None = None) -> None:
        self.attempt = attempt
        self.planned = planned
        self._max: dict[str, float] = {}
        self._step: int | None = None

    def planned_metrics(self) -> dict[str, float]:
        """The plan's peaks in bytes, as metrics (grpo_plan_* gauges) named after the
        readings they stand beside; {} without a plan."""
        p = self.planned
        if p is None:
            return {}
        out = {f"plan/gpu_{stage}_peak_bytes": gib * GIB for stage, gib in p.gpu_gib.items()}
        if p.host_rank_gib is not None:
            out["plan/host_rank_peak_bytes"] = p.host_rank_gib * GIB
        if p.driver_gib is not None:
            out["plan/driver_peak_bytes"] = p.driver_gib * GIB
        return out

    def observe(self, step: int, metrics: Mapping[str, float]) -> None:
        readings = {stage: metrics[key] for stage, key in GPU_READINGS.items() if key in metrics}
        for name, key in (("rank", RANK_RSS), ("driver", DRIVER_RSS)):
            if key in metrics:
                readings[name] = metrics[key]
        if not readings:
            return
        for name, value in readings.items():
            self._max[name] = max(self._max.get(name, 0.0), float(value))
        self._step = step

    @property
    def peaks(self) -> MeasuredPeaks | None:
        if self._step is None:
            return None
        gib = {k: round(v / GIB, 3) for k, v in self._max.items()}
        return MeasuredPeaks.model_validate({
            "gpuGiB": {s: gib[s] for s in GPU_READINGS if s in gib},
            "hostRankGiB": gib.get("rank"), "driverGiB": gib.get("driver"),
            "attempt": self.attempt, "step": self._step})

    def to_status(self) -> dict[str, object] | None:
        p = self.peaks
        return None if p is None else p.to_wire()
