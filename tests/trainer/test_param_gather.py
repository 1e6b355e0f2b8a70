"""Bucketed parameter gathering (the CPU engine's per-step weight refresh) yields exactly
the full parameters that per-parameter ``full_tensor`` gathering does, on 2 gloo ranks."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_testkit.dist import run_ranks
from grpo_testkit.gather_check import compare_gathers

pytestmark = pytest.mark.trainer


def test_bucketed_gather_matches_per_parameter_gather(tiny_lm: Path) -> None:
    dtypes = ["float32", "bfloat16"]
    arg = {"model": str(tiny_lm), "dtypes": dtypes, "bucket_bytes": 64 * 1024}
    for per_rank in run_ranks(compare_gathers, 2, arg, timeout_s=300):
        for dtype in dtypes:
            result = per_rank[dtype]
            assert result["names"] == result["reference_names"]
            assert result["shapes_match"]
            assert result["max_abs_diff"] == 0.0
            assert result["dtypes"] == [f"torch.{dtype}"]
            # One all-gather per planned bucket (every parameter here is row-sharded),
            # several parameters per collective.
            assert result["collectives"] == result["planned"]
            assert 1 < result["collectives"] < result["parameters"]
