"""Test-only fault injection (``trainer.fault_inject``, env ``GRPO_FAULT_INJECT``).

``<kind>@step=<n>`` makes a real failure happen at step n, so the exit-code mapping
(``errors.py``), the operator's remediation ladder and the memory watchdog are tested
against the failures themselves, not against mocks of them.
"""

from __future__ import annotations

import logging
import mmap
import os
import time

from .config_error import ConfigError
from .errors import CUDA_OOM_TEXT

log = logging.getLogger(__name__)

# cuda_oom: the worker raises a real torch.OutOfMemoryError (labelled as injected).
# worker_exit: the worker process dies (os._exit), as a lost node looks to Ray.
# driver_cuda_oom: the same OOM raised in the driver process.
# host_oom: the driver allocates host memory until the kernel kills it (a real
#   OOMKilled under a container memory limit; never use it without one).
# leak_host: every rank keeps a few MiB more per step (the memory watchdog's test).
# slow_rollout: every rank sleeps SLOW_ROLLOUT_S at the start of step n's rollout (a signal
#   sent meanwhile lands inside a rollout; the run's results do not change).
# engine_exit_mid_push: the last disaggregated rollout engine's process dies (os._exit)
#   inside the weight push of policy n, after its first tensor; its replacement does not.
FAULT_KINDS = ("cuda_oom", "worker_exit", "driver_cuda_oom", "host_oom", "leak_host",
               "slow_rollout", "engine_exit_mid_push")
SLOW_ROLLOUT_S = 5.0


def parse_fault(spec: str | None) -> tuple[str, int] | None:
    """``GRPO_FAULT_INJECT=<kind>@step=<n>`` -> (kind, n).

    ``leak_host:<MiB>[@step=<n>]`` -> ("leak_host", n): from step n (default 1) on,
    every rank keeps ``<MiB>`` more host memory per step (``leak_mib_per_step``).
    """
    if not spec:
        return None
    kind, _, where = spec.partition("@")
    if kind.startswith("leak_host:"):
        leak_mib_per_step(spec)  # validates the amount
        kind = "leak_host"
        if not where:
            return kind, 1
    if not where.startswith("step="):
        raise ConfigError("trainer.fault_inject", f"expected <kind>@step=<n>, got {spec!r}")
    try:
        step = int(where.removeprefix("step="))
    except ValueError:
        raise ConfigError("trainer.fault_inject", f"bad step in {spec!r}") from None
    if kind not in FAULT_KINDS:
        raise ConfigError("trainer.fault_inject", f"unknown fault {kind!r}; one of {FAULT_KINDS}")
    return kind, step


def leak_mib_per_step(spec: str | None) -> float:
    """MiB per step of a ``leak_host:<MiB>`` fault; 0 for any other spec."""
    if not spec or not spec.startswith("leak_host:"):
        return 0.0
    amount = spec.removeprefix("leak_host:").partition("@")[0]
    try:
        mib = float(amount)
    except ValueError:
        raise ConfigError("trainer.fault_inject", f"bad MiB in {spec!r}") from None
    if not 0 < mib <= 1024:
        raise ConfigError("trainer.fault_inject", f"leak must be in (0, 1024] MiB: {spec!r}")
    return mib


def allocate_until_killed(step: int) -> None:
    """Touch ever more host memory; under a memory limit the kernel ends this process."""
    log.error(
        "INJECTED FAULT (GRPO_FAULT_INJECT) host_oom at step %d: allocating host memory "
        "until the kernel's OOM killer ends this process",
        step,
    )
    hoard = []
    while True:
        hoard.append(b"\x01" * (64 << 20))  # written, so the pages are really committed


def raise_injected_oom(where: str, step: int) -> None:
    import torch

    raise torch.OutOfMemoryError(
        f"INJECTED FAULT (GRPO_FAULT_INJECT) in {where} at step {step}: "
        f"{CUDA_OOM_TEXT}. Tried to allocate 2.00 GiB"
    )


class RankFaults:
    """One rank's side of the configured fault: which rank fails, in which stage."""

    def __init__(self, spec: str | None, rank: int, world_size: int) -> None:
        self.fault = parse_fault(spec)
        self.rank = rank
        self.world_size = world_size
        self._leak_bytes = int(leak_mib_per_step(spec) * 2**20)
        self._leaked: list[mmap.mmap] = []

    def at(self, stage: str, step: int) -> None:
        """The fault due in ``stage`` ("generate" or "update") of ``step``, if any."""
        if self.fault is None or self.fault[1] != step:
            return
        kind = self.fault[0]
        if kind == "cuda_oom" and stage == "update" and self.rank == 0:
            raise_injected_oom(f"worker rank {self.rank} ({stage})", step)
        if kind == "slow_rollout" and stage == "generate":
            log.warning("INJECTED FAULT (GRPO_FAULT_INJECT): rank %d sleeps %.0f s", self.rank,
                        SLOW_ROLLOUT_S)
            time.sleep(SLOW_ROLLOUT_S)
        if kind == "worker_exit" and stage == "generate" and self.rank == self.world_size - 1:
            log.error("INJECTED FAULT (GRPO_FAULT_INJECT): worker rank %d exits", self.rank)
            os._exit(1)

    def leak(self, step: int) -> None:
        """``leak_host`` fault: a real leak, written pages kept alive for good.

        Fresh anonymous pages from the kernel, not malloc: a heap allocation may reuse
        pages an earlier step freed and that are still resident, so RSS would grow by
        less than the leak (CI read 2.7 MiB/step for 4).
        """
        if self._leak_bytes and self.fault is not None and step >= self.fault[1]:
            pages = mmap.mmap(-1, self._leak_bytes)
            for offset in range(0, self._leak_bytes, mmap.PAGESIZE):
                pages[offset] = 1  # written, so each page is really committed
            self._leaked.append(pages)
