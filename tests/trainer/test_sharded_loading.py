"""Sharded and rank-0 init give from_pretrained's weights; a sharded rank reads only its share.

One set of 2 spawned gloo ranks (no Ray) loads every model with every strategy:
the tiny Qwen2, the tiny Qwen2.5-VL (checkpoint keys renamed on load), a tied,
bf16-on-disk Qwen2 with odd sizes (uneven last chunks, dtype conversion), and a
~160 MB random Qwen2 in one file, for memory: a rank's mapped file pages
(``RssFile``) show which part of the file it touched.

Why not ``/proc/self/io`` read_bytes per rank: the ranks share the page cache and
the kernel reads ahead around each fault (read_ahead_kb is 8 MiB on the CI
machine), so a rank is charged for neighbouring rows that the other rank then
finds cached; only the sum over ranks is meaningful (the benchmark reports it).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_api.trainer_config import ModelConfig
from grpo_trainer.modeling import load_full
from grpo_trainer.testing.dist import run_ranks
from grpo_trainer.testing.loading import (
    LoadJob,
    LoadResult,
    Qwen2Spec,
    rank_load_many,
    safetensors_files,
    save_variant,
    write_random_qwen2,
)

pytestmark = pytest.mark.trainer

WORLD = 2
# ~79M parameters: 157 MB of bf16 on disk, 315 MB as fp32 master weights.
BIG = Qwen2Spec(hidden=2048, intermediate=5632, layers=1, vocab=8192, heads=16, kv_heads=4, files=1)


def _assert_same_as_from_pretrained(model_dir: Path, results: list[LoadResult]) -> None:
    ref = load_full(ModelConfig(path=str(model_dir)), torch.float32)
    params = {n: p.detach() for n, p in ref.named_parameters()}
    buffers = dict(ref.named_buffers())
    for res in results:
        assert set(res.params) == set(params), res.strategy
        for name, want in params.items():
            assert torch.equal(res.params[name], want), f"{res.strategy}: {name} differs"
        for name, want in buffers.items():  # rotary inv_freq is not in the checkpoint
            assert torch.equal(res.buffers[name], want), f"{res.strategy}: buffer {name} differs"


def test_sharded_and_rank0_match_from_pretrained_and_sharded_reads_its_share(
    tiny_lm: Path, tiny_vlm: Path, tmp_path: Path
) -> None:
    tied = save_variant(tiny_lm, tmp_path / "tied-bf16", tie=True, dtype="bfloat16", odd=True)
    big = write_random_qwen2(tmp_path / "big", BIG)
    strategies = ("sharded", "rank0")
    jobs = [
        LoadJob(str(tiny_lm), strategies, gather=True),
        LoadJob(str(tiny_vlm), strategies, gather=True),
        LoadJob(str(tied), strategies, gather=True),
        LoadJob(str(big), strategies),
    ]
    per_rank = run_ranks(rank_load_many, WORLD, jobs)
    for i, model_dir in enumerate([tiny_lm, tiny_vlm, tied]):
        _assert_same_as_from_pretrained(model_dir, per_rank[0][i])

    file_bytes = sum(f.stat().st_size for f in safetensors_files(big))
    fp32_bytes = BIG.numel() * 4
    sharded = [per_rank[r][3][0] for r in range(WORLD)]
    rank0 = [per_rank[r][3][1] for r in range(WORLD)]
    for res in sharded:
        # It touched about its half of the file's pages (fault-around adds 64 KiB per
        # tensor), never the whole file...
        touched = res.peak_file - res.file_before
        assert 0.4 * file_bytes < touched < 0.6 * file_bytes, res
        # ...and at its peak it never held the whole model: its fp32 half (0.5) plus
        # the file pages it mapped (bf16, half of its half: 0.25).
        assert res.peak_rss - res.rss_before < 0.9 * fp32_bytes, res
        assert res.local_numel <= BIG.numel() // WORLD + BIG.hidden * 64
    # The rank-0 baseline: rank 0 maps the whole file and holds the full fp32 model.
    assert rank0[0].peak_file - rank0[0].file_before > 0.9 * file_bytes, rank0[0]
    assert rank0[0].peak_rss - rank0[0].rss_before > 1.2 * fp32_bytes, rank0[0]
