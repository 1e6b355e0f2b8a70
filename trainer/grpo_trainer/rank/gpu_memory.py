"""A rank's GPU memory metrics, without vLLM's sleeping pool.

vLLM's sleep mode unmaps its weights and KV cache from the card, but the tensors stay
allocated in torch's caching allocator (a private pool), so torch's
``memory_allocated``/``max_memory_allocated``/``memory_reserved`` keep counting them
while FSDP trains: an update's peak then read up to the whole rollout pool above what
the card held, and could exceed the card. Here the pool's size is taken from the card
itself (what a sleep handed back to the driver, less what torch's own cache returned in
it) and left out; the rollout's peak, when the pool really is on the card, is read
before the sleep. The arithmetic is pure (CPU tests feed it synthetic readings);
``GpuMemoryMeter`` reads torch and the card around the rollout engine's sleep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass(frozen=True)
class DeviceMemory:
    """One reading of the card: the driver's free bytes and torch's reserved bytes."""

    free: int  # cudaMemGetInfo
    total: int
    reserved: int  # torch.cuda.memory_reserved: every pool, the sleeping one included

    @property
    def used(self) -> int:
        """The card as the driver sees it: torch's pools and everything outside them (CUDA
        context, NCCL and cuBLAS buffers, vLLM's CUDA graphs and cuMem mappings)."""
        return self.total - self.free


def read_device(device: torch.device) -> DeviceMemory:
    free, total = torch.cuda.mem_get_info(device)
    return DeviceMemory(int(free), int(total), int(torch.cuda.memory_reserved(device)))


def released_by_sleep(before: DeviceMemory, after: DeviceMemory) -> int:
    """Bytes a rollout engine's sleep gave back to the card that torch still counts as
    reserved: what the card gained, less what torch's cache released meanwhile (vLLM's
    sleep empties it). 0 for an engine without sleep mode."""
    return max(0, (after.free - before.free) - (before.reserved - after.reserved))


@dataclass(frozen=True)
class StepGpuMemory:
    """torch's counters after the update, and what this step measured around them."""

    allocated: int  # torch.cuda.memory_allocated
    reserved: int  # torch.cuda.memory_reserved
    update_peak: int  # torch.cuda.max_memory_allocated since the rollout's sleep
    rollout_peak: int  # torch.cuda.max_memory_allocated over the rollout (pool awake)
    asleep: int  # the rollout engine's pool, asleep during the update (released_by_sleep)
    device_used: int  # DeviceMemory.used after the update
    # DeviceMemory.used just before the engine's sleep (its pool on the card) and just
    # after it (what the update starts from: whatever vLLM left behind included). 0 when
    # not measured.
    rollout_device_used: int = 0
    asleep_device_used: int = 0
    rollout_reserved: int = 0  # torch's reserved bytes just before the engine's sleep


def card_peaks(m: StepGpuMemory) -> tuple[int, int]:
    """The card's peak over the rollout and over the update, as the plan counts a GPU
    stage (its terms include the CUDA context): torch's peak allocation plus what the card
    holds outside torch's pools (context, NCCL and cuBLAS buffers, vLLM's graphs), read
    beside it. The sleeping pool is torch's but not on the card during the update."""
    outside_rollout = max(0, m.rollout_device_used - m.rollout_reserved)
    outside_update = max(0, m.device_used - (m.reserved - m.asleep))
    update_peak = max(0, m.update_peak - m.asleep)
    return m.rollout_peak + outside_rollout, update_peak + outside_update


def gpu_memory_metrics(m: StepGpuMemory) -> dict[str, float]:
    """The step's GPU memory metrics. The sleeping pool is counted in torch's figures by
    its mapped size (its allocations are at most that, so the update's figures may read a
    few MiB low); ``gpu_vllm_asleep_bytes`` reports it, so torch's raw figures are the sum."""
    update_peak = max(0, m.update_peak - m.asleep)
    rollout_card, training_card = card_peaks(m)
    return {
        "memory/gpu_allocated_bytes": float(max(0, m.allocated - m.asleep)),
        "memory/gpu_reserved_bytes": float(max(0, m.reserved - m.asleep)),
        "memory/gpu_peak_bytes": float(max(m.rollout_peak, update_peak)),
        "memory/gpu_rollout_peak_bytes": float(m.rollout_peak),
        "memory/gpu_update_peak_bytes": float(update_peak),
        "memory/gpu_vllm_asleep_bytes": float(m.asleep),
        "memory/gpu_device_used_bytes": float(m.device_used),
        "memory/gpu_rollout_device_used_bytes": float(m.rollout_device_used),
        "memory/gpu_asleep_device_used_bytes": float(m.asleep_device_used),
        # What status.progress.measuredPeaks holds to the plan's GPU stages.
        "memory/gpu_rollout_card_peak_bytes": float(rollout_card),
        "memory/gpu_training_card_peak_bytes": float(training_card),
    }


class _Sleeps(Protocol):
    def sleep(self) -> None: ...


class GpuMemoryMeter:
    """One rank's GPU memory over a step: the rollout's peak (read before the engine
    sleeps), the update's peak (from the sleep on) and the pool the sleep unmapped. On a
    CPU rank it only puts the engine to sleep and reports nothing."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.rollout_peak = 0
        self.asleep = 0
        self.rollout_device_used = 0
        self.asleep_device_used = 0
        self.rollout_reserved = 0

    def start_rollout(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)

    def sleep(self, engine: _Sleeps) -> None:
        if not self.cuda:
            engine.sleep()
            return
        self.rollout_peak = int(torch.cuda.max_memory_allocated(self.device))
        before = read_device(self.device)
        engine.sleep()
        after = read_device(self.device)
        self.asleep = released_by_sleep(before, after)
        self.rollout_device_used, self.asleep_device_used = before.used, after.used
        self.rollout_reserved = before.reserved
        torch.cuda.reset_peak_memory_stats(self.device)

    def metrics(self) -> dict[str, float]:
        if not self.cuda:
            return {}
        card = read_device(self.device)
        return gpu_memory_metrics(
            StepGpuMemory(
                allocated=int(torch.cuda.memory_allocated(self.device)),
                reserved=card.reserved,
                update_peak=int(torch.cuda.max_memory_allocated(self.device)),
                rollout_peak=self.rollout_peak,
                asleep=self.asleep,
                device_used=card.used,
                rollout_device_used=self.rollout_device_used,
                asleep_device_used=self.asleep_device_used,
                rollout_reserved=self.rollout_reserved,
            )
        )
