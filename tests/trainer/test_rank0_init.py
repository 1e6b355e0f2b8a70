"""Rank-0 init over the rank's device (rank0_init.load_from_rank0) keeps exactly the
shards torch's own broadcast does: 2 spawned gloo ranks, a tied, bf16-on-disk tiny Qwen2
with odd sizes (uneven last chunks). On a GPU it runs on NCCL for offloaded parameters
(tests/unit/test_collective_devices.py pins that choice)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_testkit.dist import run_ranks
from grpo_testkit.loading import save_variant
from grpo_testkit.rank0_check import rank_shards

pytestmark = pytest.mark.trainer


def test_rank0_broadcast_on_the_device_keeps_torchs_shards(tiny_lm: Path,
                                                           tmp_path: Path) -> None:
    odd = save_variant(tiny_lm, tmp_path / "odd", tie=True, dtype="bfloat16", odd=True)
    for rank, got in enumerate(run_ranks(rank_shards, 2, str(odd))):
        assert set(got["ours"]) == set(got["theirs"])
        for name, want in got["theirs"].items():
            assert torch.equal(got["ours"][name], want), f"rank {rank}: {name} differs"
        assert any(t.numel() for t in got["ours"].values())
