"""The reconcile-time quantiles the operator's scale curve reports (bench/operator_probes.py)
are Prometheus' histogram_quantile of the operator's own histogram."""

from __future__ import annotations

import math
from pathlib import Path
from types import ModuleType

import pytest

from grpo_testkit.script_modules import load_script

pytestmark = pytest.mark.unit

BENCH = Path(__file__).resolve().parents[2] / "bench"
SCRAPE = """# TYPE grpo_operator_reconcile_duration_seconds histogram
grpo_operator_reconcile_duration_seconds_bucket{le="0.5"} 10.0
grpo_operator_reconcile_duration_seconds_bucket{le="1.0"} 20.0
grpo_operator_reconcile_duration_seconds_bucket{le="+Inf"} 24.0
grpo_operator_reconcile_duration_seconds_count 24.0
other_bucket{le="1.0"} 99.0
"""


def _probes() -> ModuleType:
    return load_script(BENCH / "operator_probes.py")


@pytest.mark.parametrize(("q", "expected"), [(0.25, 0.3), (0.5, 0.6), (0.75, 0.9)])
def test_linear_within_the_bucket_the_quantile_falls_in(q: float, expected: float) -> None:
    name = "grpo_operator_reconcile_duration_seconds"
    assert _probes().histogram_quantile(SCRAPE, name, q) == pytest.approx(expected)


def test_past_the_last_finite_bucket_its_bound_and_no_samples_nan() -> None:
    probes = _probes()
    assert probes.histogram_quantile(SCRAPE, "grpo_operator_reconcile_duration_seconds",
                                     0.99) == 1.0
    assert math.isnan(probes.histogram_quantile(SCRAPE, "absent", 0.5))
