"""The operator's Prometheus metrics (served with /healthz by `main`)."""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Iterator

from prometheus_client import REGISTRY, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from grpo_api.contract import Phase

PHASES = tuple(p.value for p in Phase)
JOB_PHASES: dict[tuple[str, str], str] = {}  # (namespace, name) -> phase, from job events


class _JobsByPhase(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        g = GaugeMetricFamily("grpo_operator_jobs", "GRPOJobs by phase", labels=["phase"])
        counts = Tally(JOB_PHASES.values())
        for phase in PHASES:
            g.add_metric([phase], counts.get(phase, 0))
        yield g


REGISTRY.register(_JobsByPhase())

RECONCILE_SECONDS = Histogram(
    "grpo_operator_reconcile_duration_seconds", "Time to reconcile a GRPOJob once",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)
RESTARTS = Counter("grpo_operator_restarts_total", "Attempt restarts", ["reason"])
TIME_TO_RECOVER = Histogram(
    "grpo_operator_time_to_recover_seconds",
    "From a failed attempt being seen to the next attempt's cluster created (incl. backoff)",
    buckets=(1, 2, 5, 10, 30, 60, 120, 300, 600, 1200),
)
API_ERRORS = Counter("grpo_operator_api_errors_total", "Kubernetes API errors", ["operation"])
# A decision parses the spec once and runs the memory planner at most once (a spec change,
# the next attempt, an attempt that failed and restarts; reconcile.planning.Planner).
PLANS_PER_DECISION = Histogram(
    "grpo_operator_plans_per_decision", "Memory planner runs of one reconcile decision",
    ["event"], buckets=(0, 1, 2, 3),
)
