"""vLLM tier: its tiny models (`vllm_lm`, `vllm_vlm`, `vllm_lora_lm`) are in tests/conftest.py,
beside the GPU tier's, with the head_dim vLLM's CPU attention takes. A CPU vLLM's kernels
cannot run on (no AVX-512) fails every test at once, saying why, instead of a SIGILL deep
in a Ray actor."""

from __future__ import annotations

import pytest

from grpo_testkit.cpu_features import vllm_cpu_problem


@pytest.fixture(autouse=True, scope="session")
def _vllm_cpu_runs_here() -> None:
    if (problem := vllm_cpu_problem()) is not None:
        pytest.fail(problem)
