"""The vLLM tiers' CPU check (grpo_testkit.cpu_features) reads /proc/cpuinfo's flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_testkit.cpu_features import vllm_cpu_problem

pytestmark = pytest.mark.unit


def cpuinfo(tmp_path: Path, flags: str) -> Path:
    f = tmp_path / "cpuinfo"
    f.write_text(f"processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 {flags}\n\n")
    return f


def test_an_avx512_cpu_runs_vllms_kernels(tmp_path: Path) -> None:
    assert vllm_cpu_problem(cpuinfo(tmp_path, "avx2 avx512f avx512bw")) is None


def test_an_avx2_cpu_is_named_with_the_reason_and_the_fix(tmp_path: Path) -> None:
    problem = vllm_cpu_problem(cpuinfo(tmp_path, "fma avx f16c avx2"))
    assert problem is not None
    assert "no AVX-512 (AVX2" in problem and "SIGILL (exit 132)" in problem
    assert "run them on an AVX-512 CPU" in problem
