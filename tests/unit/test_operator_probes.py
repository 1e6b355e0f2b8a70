"""The reconcile-time quantiles the operator's scale curve reports (bench/operator_probes.py)
are Prometheus' histogram_quantile of the operator's own histogram."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
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


def test_a_forked_childs_shared_pages_count_once_in_the_pair_pss() -> None:
    """The pod's memory with the admission process beside the operator: PSS of both, which
    is less than their two RSS figures added (the child shares the parent's pages)."""
    probes = _probes()
    parent = subprocess.Popen([sys.executable, "-c", FORKS_A_CHILD], stdout=subprocess.PIPE,
                              text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert probes.children(parent.pid) == [child]
        rss = sum(probes.proc_usage(pid)[1] for pid in (parent.pid, child))
        pss = probes.pss_mib([parent.pid, child])
        assert 40 < pss < rss - 20, (pss, rss)  # 64 MiB filled once, shared
    finally:
        os.kill(child, signal.SIGKILL)
        parent.kill()
        parent.wait()


FORKS_A_CHILD = """
import os, sys, time
block = bytearray(64 * 2**20)
for i in range(0, len(block), 4096):
    block[i] = 1  # touched: resident
pid = os.fork()
if pid == 0:
    time.sleep(60)
    os._exit(0)
print(pid, flush=True)
time.sleep(60)
"""
