"""Sharded and rank-0 init give from_pretrained's weights; a sharded rank reads only its share.

One set of 2 spawned gloo ranks (no Ray) loads every model with every strategy:
the tiny Qwen2, the tiny Qwen2.5-VL (checkpoint keys renamed on load), a tied,
bf16-on-disk Qwen2 with odd sizes (uneven last chunks, dtype conversion), and a
~56 MB random Qwen2 in two files, read shard by shard with every safetensors read
noted (``recording_reads``: the byte range of each slice asked for).

What is asserted is what the loader asked for, which the machine cannot change:
the ranks' byte ranges are disjoint and together cover every tensor once, each rank
reads about half, and its ``read()`` calls fetch no more than a fraction of the
file. Resident pages (``RssFile``, ``/proc/self/io`` read_bytes) depend on the page
cache, read-ahead and fault-around: bench/bench_loading.py reports them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_api.trainer_config import ModelConfig
from grpo_testkit.dist import run_ranks
from grpo_testkit.loading import (
    FileRead,
    LoadJob,
    LoadResult,
    Qwen2Spec,
    rank_load_many,
    safetensors_files,
    save_variant,
    write_random_qwen2,
)
from grpo_trainer.model.modeling import load_full
from grpo_trainer.model.sharded_load import safetensors_layout

pytestmark = pytest.mark.trainer

WORLD = 2
# ~28M parameters: 56 MB of bf16 on disk, in two files.
BIG = Qwen2Spec(hidden=1024, intermediate=2816, layers=1, vocab=8192, heads=16, kv_heads=4, files=2)


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
        # Last: the loads before it did the imports, whose .py reads rchar would count.
        LoadJob(str(big), ("sharded",), record_reads=True),
    ]
    per_rank = run_ranks(rank_load_many, WORLD, jobs)
    for i, model_dir in enumerate([tiny_lm, tiny_vlm, tied]):
        _assert_same_as_from_pretrained(model_dir, per_rank[0][i])

    tensors = _tensor_bytes(big)
    total = sum(end - start for start, end in tensors.values())
    sharded = [per_rank[r][3][0] for r in range(WORLD)]
    for res in sharded:
        # Every read lies within one tensor, no byte is read twice, and the rank's
        # reads add up to half the checkpoint (its rows of every tensor), not all of it.
        for read in res.reads:
            start, end = tensors[(read.file, read.key)]
            assert start <= read.start <= read.end <= end, read
        assert _overlaps(res.reads) == 0, res.strategy
        own = sum(r.end - r.start for r in res.reads)
        assert 0.45 * total < own < 0.55 * total, (own, total)
        # Nothing read around safetensors: its read() calls (headers, config, index)
        # are a small fraction of the file.
        assert res.read_calls < 0.2 * total, (res.read_calls, total)
        # It holds its half of the parameters.
        assert res.local_numel <= BIG.numel() // WORLD + BIG.hidden * 64
    # Together the ranks read every tensor byte exactly once.
    reads = [r for res in sharded for r in res.reads]
    assert _overlaps(reads) == 0
    assert sum(r.end - r.start for r in reads) == total


def _tensor_bytes(model_dir: Path) -> dict[tuple[str, str], tuple[int, int]]:
    """(file name, key) -> the tensor's [start, end) bytes in its file."""
    out: dict[tuple[str, str], tuple[int, int]] = {}
    for f in safetensors_files(model_dir):
        data_start, layout = safetensors_layout(f)
        for key, (begin, end, _) in layout.items():
            out[(f.name, key)] = (data_start + begin, data_start + end)
    return out


def _overlaps(reads: list[FileRead]) -> int:
    """Bytes read more than once, over all ``reads``."""
    twice = 0
    by_file: dict[str, list[tuple[int, int]]] = {}
    for r in reads:
        by_file.setdefault(r.file, []).append((r.start, r.end))
    for spans in by_file.values():
        reach = 0
        for start, end in sorted(spans):
            twice += max(0, min(end, reach) - start)
            reach = max(reach, end)
    return twice
