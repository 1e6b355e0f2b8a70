"""GPU memory metrics without vLLM's sleeping pool (grpo_trainer.rank.gpu_memory), from
synthetic readings of a CUDA rank: an H100 (80 GiB) with a colocated vLLM engine."""

from __future__ import annotations

import pytest
import torch

from grpo_trainer.rank.gpu_memory import (
    DeviceMemory,
    GpuMemoryMeter,
    StepGpuMemory,
    gpu_memory_metrics,
    released_by_sleep,
)

pytestmark = pytest.mark.unit
GiB = 2**30
CARD = 80 * GiB


def test_the_update_peak_leaves_out_the_pool_vllm_unmapped() -> None:
    """vLLM's sleep unmaps its 45 GiB pool, but torch still counts it as allocated: torch's
    raw update peak (45 + 40 GiB) exceeds the card. The metrics report what the card held."""
    # The sleep gave the card 46 GiB, of which 1 GiB was torch's own cache being emptied.
    before = DeviceMemory(free=CARD - 60 * GiB, total=CARD, reserved=58 * GiB)
    after = DeviceMemory(free=CARD - 14 * GiB, total=CARD, reserved=57 * GiB)
    asleep = released_by_sleep(before, after)
    assert asleep == 45 * GiB
    step = StepGpuMemory(
        allocated=(45 + 12) * GiB,
        reserved=(45 + 42) * GiB,
        update_peak=(45 + 40) * GiB,  # torch.cuda.max_memory_allocated: above the card
        rollout_peak=55 * GiB,  # read before the sleep: the pool really was on the card
        asleep=asleep,
        device_used=44 * GiB,
    )
    m = gpu_memory_metrics(step)
    assert m["memory/gpu_update_peak_bytes"] == 40 * GiB
    assert m["memory/gpu_rollout_peak_bytes"] == 55 * GiB
    assert m["memory/gpu_peak_bytes"] == 55 * GiB <= CARD
    assert m["memory/gpu_allocated_bytes"] == 12 * GiB
    assert m["memory/gpu_reserved_bytes"] == 42 * GiB
    # Both views: torch's raw figure is the reported one plus the sleeping pool.
    assert m["memory/gpu_vllm_asleep_bytes"] + m["memory/gpu_update_peak_bytes"] == 85 * GiB
    assert m["memory/gpu_device_used_bytes"] == 44 * GiB


def test_the_cards_own_figure_is_reported_beside_each_of_torchs() -> None:
    """torch counts only its own allocator; the card also holds the CUDA context, NCCL and
    cuBLAS buffers and what vLLM keeps outside torch through a sleep (its CUDA graphs
    unless offloaded). The meter reads the card (cudaMemGetInfo) at the rollout's end,
    right after the sleep and after the update, beside torch's figures of those moments."""

    class Engine:
        def sleep(self) -> None:
            pass

    readings = iter([
        DeviceMemory(free=CARD - 70 * GiB, total=CARD, reserved=64 * GiB),  # before the sleep
        DeviceMemory(free=CARD - 24 * GiB, total=CARD, reserved=63 * GiB),  # after it
        DeviceMemory(free=CARD - 50 * GiB, total=CARD, reserved=(45 + 40) * GiB),  # update
    ])
    meter = GpuMemoryMeter(torch.device("cuda", 0))
    with pytest.MonkeyPatch.context() as mp:  # a fake card: the readings above
        from grpo_trainer.rank import gpu_memory

        mp.setattr(gpu_memory, "read_device", lambda _device: next(readings))
        mp.setattr(torch.cuda, "max_memory_allocated", lambda _d: 60 * GiB)
        mp.setattr(torch.cuda, "reset_peak_memory_stats", lambda _d: None)
        mp.setattr(torch.cuda, "memory_allocated", lambda _d: (45 + 30) * GiB)
        meter.sleep(Engine())
        m = meter.metrics()
    assert m["memory/gpu_rollout_device_used_bytes"] == 70 * GiB
    assert m["memory/gpu_asleep_device_used_bytes"] == 24 * GiB
    assert m["memory/gpu_device_used_bytes"] == 50 * GiB
    assert m["memory/gpu_vllm_asleep_bytes"] == 45 * GiB
    assert m["memory/gpu_reserved_bytes"] == 40 * GiB


def test_an_engine_without_sleep_mode_changes_nothing() -> None:
    card = DeviceMemory(free=20 * GiB, total=CARD, reserved=58 * GiB)
    assert released_by_sleep(card, card) == 0
    step = StepGpuMemory(12 * GiB, 14 * GiB, 30 * GiB, 25 * GiB, 0, 60 * GiB)
    m = gpu_memory_metrics(step)
    assert m["memory/gpu_peak_bytes"] == 30 * GiB
    assert m["memory/gpu_allocated_bytes"] == 12 * GiB


def test_a_cpu_rank_reports_no_gpu_memory_and_still_sleeps_its_engine() -> None:
    class Engine:
        slept = 0

        def sleep(self) -> None:
            self.slept += 1

    meter, engine = GpuMemoryMeter(torch.device("cpu")), Engine()
    meter.start_rollout()
    meter.sleep(engine)
    assert engine.slept == 1 and meter.metrics() == {}
