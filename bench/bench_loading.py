"""Model loading into FSDP2: naive vs rank0 vs sharded, against one sequential read of the files.

A random-weight Qwen2-architecture checkpoint (bf16 safetensors in several files,
~1 GB by default, cached under ~/.cache/grpo-operator/bench/) is loaded by W gloo
ranks in spawned processes (no Ray) with each init strategy, into fp32 master
weights on the CPU. Per strategy and W: wall time (barrier to barrier) and each
rank's peak resident set during the load above what it held before, summed over
ranks. The physical limit is one process reading the files sequentially.

Cold and warm: before each "cold" run the files' pages are dropped from the page
cache with posix_fadvise(DONTNEED) (dropping the whole cache needs root, this
does not); "warm" runs right after, with the files cached. Usage:

    .venv/bin/python bench/bench_loading.py [--world 2,4 --hidden 2048 --layers 8 ...]

"Model bytes" is the size of the fp32 weights the trainer holds (twice the bf16
file). Memory: VmHWM (peak RSS, file-backed pages included) after resetting it via
/proc/self/clear_refs; RssAnon and RssFile peaks are sampled every 5 ms.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from grpo_trainer.testing.dist import run_ranks
from grpo_trainer.testing.loading import (
    LoadJob,
    LoadResult,
    Qwen2Spec,
    cached_random_qwen2,
    evict_page_cache,
    rank_load_many,
    safetensors_files,
)

STRATEGIES = ("naive", "rank0", "sharded")
GiB = 2**30


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", default="2,4", help="comma-separated rank counts")
    p.add_argument("--hidden", type=int, default=2048)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--file-dtype", choices=("bfloat16", "float32"), default="bfloat16")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--json", action="store_true", help="one JSON line per measurement")
    return p.parse_args()


def sequential_read(files: list[Path]) -> tuple[float, float]:
    """Seconds to read every file once, cold then warm (16 MiB reads, one process)."""
    out = []
    for cold in (True, False):
        if cold:
            evict_page_cache(files)
        t0 = time.perf_counter()
        for f in files:
            with open(f, "rb", buffering=0) as fh:
                while fh.read(16 * 2**20):
                    pass
        out.append(time.perf_counter() - t0)
    return out[0], out[1]


def materialise_floor(files: list[Path]) -> float:
    """Seconds for one process (1 thread, warm cache) to fill fresh fp32 memory from the files.

    What any strategy must pay at least once over all ranks: the fp32 weights are
    new memory, and on this VM a first touch costs ~1.5 s per GiB (page faults),
    far more than reading cached file pages.
    """
    import torch
    from safetensors import safe_open

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    for f in files:
        with safe_open(f, framework="pt") as sf:
            for key in sf.keys():  # noqa: SIM118 (safe_open is not iterable)
                src = sf.get_tensor(key)  # a view of the mapped file
                torch.empty(src.shape, dtype=torch.float32).copy_(src)
    return time.perf_counter() - t0


def summarise(results: list[LoadResult]) -> dict[str, float]:
    """One strategy's run: the slowest rank's wall and memory summed over ranks."""
    return {
        "wall_s": max(r.wall_s for r in results),
        "peak_rss": sum(r.peak_rss - r.rss_before for r in results),
        "peak_anon": sum(r.peak_anon - r.anon_before for r in results),
        "peak_file": sum(r.peak_file - r.file_before for r in results),
        "after_rss": sum(r.rss_after - r.rss_before for r in results),
        "read_bytes": sum(r.read_bytes for r in results),
    }


def main() -> int:
    args = parse_args()
    spec = Qwen2Spec(
        hidden=args.hidden,
        intermediate=args.intermediate,
        layers=args.layers,
        vocab=args.vocab,
        files=args.files,
        dtype=args.file_dtype,
    )
    name = f"qwen2-h{spec.hidden}-l{spec.layers}-v{spec.vocab}-{spec.dtype}-{spec.files}f"
    t0 = time.perf_counter()
    model = cached_random_qwen2(name, spec)
    files = safetensors_files(model)
    file_bytes = sum(f.stat().st_size for f in files)
    model_bytes = spec.numel() * 4
    print(
        f"model {model} ({time.perf_counter() - t0:.1f} s): {spec.numel() / 1e6:.0f}M params, "
        f"files {file_bytes / GiB:.2f} GiB {spec.dtype}, fp32 weights {model_bytes / GiB:.2f} GiB",
        flush=True,
    )
    warm_model = cached_random_qwen2(
        "qwen2-tiny-warmup", Qwen2Spec(hidden=64, intermediate=128, layers=1, vocab=256, files=1)
    )
    seq_cold, seq_warm = sequential_read(files)
    floor = materialise_floor(files)
    print(
        f"sequential read: cold {seq_cold:.2f} s ({file_bytes / GiB / seq_cold:.2f} GiB/s), "
        f"warm {seq_warm:.2f} s ({file_bytes / GiB / seq_warm:.2f} GiB/s); "
        f"fp32 materialisation in one process (warm): {floor:.2f} s",
        flush=True,
    )
    strategies = tuple(args.strategies.split(","))
    rows: list[dict[str, Any]] = []
    for world in (int(w) for w in args.world.split(",")):
        # First a tiny model through every path: imports and first-call costs.
        jobs = [LoadJob(str(warm_model), strategies)]
        for s in strategies:
            jobs += [LoadJob(str(model), (s,), evict=True), LoadJob(str(model), (s,))]
        t0 = time.perf_counter()
        per_rank = run_ranks(rank_load_many, world, jobs, timeout_s=1800)
        print(f"W={world}: {len(jobs)} loads in {time.perf_counter() - t0:.0f} s", flush=True)
        for j, job in enumerate(jobs[1:], start=1):
            summary = summarise([per_rank[r][j][0] for r in range(world)])
            row = {"world": world, "strategy": job.strategies[0], "cold": job.evict, **summary}
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    report(rows, model_bytes, file_bytes, seq_cold, seq_warm, floor)
    return 0


def report(
    rows: list[dict[str, Any]],
    model_bytes: int,
    file_bytes: int,
    seq_cold: float,
    seq_warm: float,
    floor: float,
) -> None:
    print(
        f"\nmodel bytes (fp32) {model_bytes / GiB:.2f} GiB; file bytes {file_bytes / GiB:.2f} GiB; "
        "memory = peak above each rank's pre-load RSS, summed over ranks"
    )
    head = (
        f"{'W':>2} {'strategy':<8} {'cache':<5} {'wall s':>7} {'x seq':>6} {'x fill':>6} "
        f"{'peak RSS GiB':>12} {'x model':>8} {'anon GiB':>9} {'file GiB':>9} "
        f"{'after GiB':>9} {'read GiB':>9}"
    )
    print(head)
    for r in rows:
        seq = seq_cold if r["cold"] else seq_warm
        print(
            f"{r['world']:>2} {r['strategy']:<8} {'cold' if r['cold'] else 'warm':<5} "
            f"{r['wall_s']:>7.2f} {r['wall_s'] / seq:>6.2f} {r['wall_s'] / floor:>6.2f} "
            f"{r['peak_rss'] / GiB:>12.2f} "
            f"{r['peak_rss'] / model_bytes:>8.2f} {r['peak_anon'] / GiB:>9.2f} "
            f"{r['peak_file'] / GiB:>9.2f} {r['after_rss'] / GiB:>9.2f} "
            f"{r['read_bytes'] / GiB:>9.2f}"
        )
    print("\nratios (sharded / baseline), per W and cache state:")
    for r in rows:
        if r["strategy"] != "sharded":
            continue
        for base in ("naive", "rank0"):
            b = next(
                (
                    x
                    for x in rows
                    if x["world"] == r["world"] and x["cold"] == r["cold"] and x["strategy"] == base
                ),
                None,
            )
            if b is None:
                continue
            rss, wall = r["peak_rss"] / b["peak_rss"], r["wall_s"] / b["wall_s"]
            cache = "cold" if r["cold"] else "warm"
            print(f"  W={r['world']} {cache}: vs {base}: peak RSS {rss:.2f}x, wall {wall:.2f}x")
    print(
        "targets: sharded peak RSS summed <= 1.5x model bytes; sharded wall <= 1.5x sequential read"
    )


if __name__ == "__main__":
    sys.exit(main())
