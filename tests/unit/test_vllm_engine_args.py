"""vLLM's engine arguments and sleep level: decided from the config alone, so the CUDA
branch (which no CPU test can start) is pinned here."""

from __future__ import annotations

from dataclasses import replace

import pytest

from grpo_trainer.rollout.vllm_engine import VLLMEngineConfig, engine_kwargs, sleep_level

pytestmark = pytest.mark.unit

FULL = VLLMEngineConfig(
    model_path="/models/qwen2.5-vl-72b",
    dtype="bfloat16",
    tensor_parallel_size=4,
    max_model_len=4096,
    max_num_seqs=64,
    gpu_memory_utilization=0.55,
    cpu_kv_cache_bytes=1 << 30,
    seed=1,
    enable_sleep_mode=True,
)
LORA = replace(FULL, lora_rank=64)


def cuda(cfg: VLLMEngineConfig) -> dict[str, object]:
    return engine_kwargs(cfg, on_cpu=False, sleep_mode=True, distributed=True)


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_cuda_engines_never_build_vllms_custom_all_reduce(tp: int) -> None:
    """Each rank actor sees one GPU: vLLM's custom all-reduce would map its TP peers to
    device ids it cannot see (IndexError at start-up). NCCL all-reduces instead."""
    kwargs = cuda(replace(FULL, tensor_parallel_size=tp))
    assert kwargs["disable_custom_all_reduce"] is True
    assert kwargs["tensor_parallel_size"] == tp
    assert kwargs["distributed_executor_backend"] == "external_launcher"


def test_full_fine_tuning_discards_the_weights_asleep() -> None:
    """Every sync rewrites every parameter (tests/vllm: test_a_sync_rewrites_every_
    parameter_vllm_holds), so sleep level 2 drops them instead of copying them to the host
    and back each step. Placeholder weights at start-up are not used: vLLM's dummy loader
    also randomises buffers no sync carries."""
    assert sleep_level(FULL) == 2
    assert "load_format" not in cuda(FULL)


def test_lora_keeps_its_base_asleep() -> None:
    """Only the adapters travel at a sync: the base must survive each sleep (level 1)."""
    kwargs = cuda(LORA)
    assert kwargs["enable_lora"] is True and kwargs["max_lora_rank"] == 64
    assert sleep_level(LORA) == 1


def test_cuda_sizes_by_utilisation_and_cpu_by_kv_bytes() -> None:
    gpu = cuda(FULL)
    assert gpu["gpu_memory_utilization"] == 0.55 and gpu["enable_sleep_mode"] is True
    assert "kv_cache_memory_bytes" not in gpu and "enforce_eager" not in gpu
    cpu = engine_kwargs(FULL, on_cpu=True, sleep_mode=False, distributed=True)
    assert cpu["kv_cache_memory_bytes"] == 1 << 30 and cpu["enforce_eager"] is True
    assert "gpu_memory_utilization" not in cpu and cpu["enable_sleep_mode"] is False


def test_tensor_parallel_needs_the_trainers_process_group() -> None:
    with pytest.raises(ValueError, match=r"torch\.distributed"):
        engine_kwargs(FULL, on_cpu=False, sleep_mode=True, distributed=False)
    alone = engine_kwargs(
        replace(FULL, tensor_parallel_size=1), on_cpu=False, sleep_mode=True, distributed=False
    )
    assert "distributed_executor_backend" not in alone
