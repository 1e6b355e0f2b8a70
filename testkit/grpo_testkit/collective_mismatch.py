"""Ranks that issue different collectives for real (tests/trainer/test_rank_crash.py): Ray
actors on one gloo group whose all-gathers differ in size, so gloo aborts one process from
C++ as it does when a rank skips an FSDP unit."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


class MismatchedRank:
    """A Ray actor standing in for a trainer rank: its stacks file armed as
    ``Worker.arm_signals`` arms it, then one all-gather of the size it is given."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def join(self, port: int) -> None:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}",
                                rank=self.rank, world_size=self.world)

    def arm(self) -> dict[str, Any]:
        import ray

        from grpo_trainer.liveness.stall_monitor import install_stack_dump

        return {"pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
                "stacks_file": install_stack_dump(self.rank)}

    def gather(self, numel: int) -> None:
        part = torch.zeros(numel)
        dist.all_gather_single(torch.empty(numel * self.world), part)
