"""Model loading into FSDP2: naive vs rank0 vs sharded, against one sequential read of the files.

A random-weight Qwen2-architecture checkpoint (bf16 safetensors in several files,
~1 GB by default, cached under ~/.cache/grpo-operator/bench/) is loaded by W gloo
ranks in spawned processes (no Ray) with each init strategy, into fp32 master
weights on the CPU. Per strategy and W: wall time (barrier to barrier) and each
rank's peak resident set during the load above what it held before, summed over
ranks. The physical limit is one process reading the files sequentially: rank 0
times that ("read") in the same processes, before and after the loads, and also
fills fresh fp32 memory from the cached files ("fill": the page-fault cost every
strategy pays once for the weights it ends up holding).

Cold and warm: before each "cold" run the files' pages are dropped from the page
cache with posix_fadvise(DONTNEED) (dropping the whole cache needs root, this
does not); "warm" runs right after, with the files cached. Usage:

    .venv/bin/python bench/bench_loading.py [--world 2,4 --hidden 2048 --layers 8 ...]

"Model bytes" is the size of the fp32 weights the trainer holds (twice the bf16
file). Memory: VmHWM (peak RSS, file-backed pages included) after resetting it via
/proc/self/clear_refs; RssAnon and RssFile peaks are sampled every 5 ms. "file/rank x
files": the busiest rank's peak of mapped file pages over the files' size (a sharded
rank maps about 1/W of them; the test asserts the byte ranges it reads instead, which
do not depend on the page cache).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from typing import Any

from grpo_testkit.dist import run_ranks
from grpo_testkit.loading import (
    LoadJob,
    LoadResult,
    Qwen2Spec,
    cached_random_qwen2,
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
    p.add_argument("--rounds", type=int, default=1, help="repeat the cycle; medians")
    p.add_argument("--json", action="store_true", help="one JSON line per measurement")
    return p.parse_args()


def summarise(results: list[LoadResult]) -> dict[str, float]:
    """One strategy's run: the slowest rank's wall and memory summed over ranks."""
    return {
        "wall_s": max(r.wall_s for r in results),
        "peak_rss": sum(r.peak_rss - r.rss_before for r in results),
        "peak_anon": sum(r.peak_anon - r.anon_before for r in results),
        "peak_file": sum(r.peak_file - r.file_before for r in results),
        # The busiest rank's mapped file pages: a sharded rank's share of the file
        # (about 1/W, more with fault-around; depends on the page cache).
        "peak_file_rank": max(r.peak_file - r.file_before for r in results),
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
    file_bytes = sum(f.stat().st_size for f in safetensors_files(model))
    model_bytes = spec.numel() * 4
    print(
        f"model {model} ({time.perf_counter() - t0:.1f} s): {spec.numel() / 1e6:.0f}M params, "
        f"files {file_bytes / GiB:.2f} GiB {spec.dtype}, fp32 weights {model_bytes / GiB:.2f} GiB",
        flush=True,
    )
    warm_model = cached_random_qwen2(
        "qwen2-tiny-warmup", Qwen2Spec(hidden=64, intermediate=128, layers=1, vocab=256, files=1)
    )
    strategies = tuple(args.strategies.split(","))
    # Each round: the baselines, every strategy cold then warm, the read again; a
    # shared machine's load then hits the baseline and the strategies alike.
    cycle = [("read", True), ("read", False), ("fill", False)]
    cycle += [(s, cold) for s in strategies for cold in (True, False)]
    cycle += [("read", True), ("read", False)]
    samples: dict[tuple[int, str, bool], list[dict[str, float]]] = defaultdict(list)
    for world in (int(w) for w in args.world.split(",")):
        # First a tiny model through every path: imports and first-call costs.
        jobs = [LoadJob(str(warm_model), strategies)]
        for _ in range(args.rounds):
            jobs += [LoadJob(str(model), (s,), evict=cold) for s, cold in cycle]
        t0 = time.perf_counter()
        per_rank = run_ranks(rank_load_many, world, jobs, timeout_s=3600)
        print(f"W={world}: {len(jobs)} loads in {time.perf_counter() - t0:.0f} s", flush=True)
        for j, job in enumerate(jobs[1:], start=1):
            summary = summarise([per_rank[r][j][0] for r in range(world)])
            samples[(world, job.strategies[0], job.evict)].append(summary)
            if args.json:
                row = {"world": world, "strategy": job.strategies[0], "cold": job.evict}
                print(json.dumps({**row, **summary}), flush=True)
    rows = [
        {"world": w, "strategy": s, "cold": c, **median_of(v)} for (w, s, c), v in samples.items()
    ]
    report(rows, model_bytes, file_bytes)
    return 0


def median_of(runs: list[dict[str, float]]) -> dict[str, float]:
    return {k: statistics.median(r[k] for r in runs) for k in runs[0]}


def report(rows: list[dict[str, Any]], model_bytes: int, file_bytes: int) -> None:
    def find(world: int, strategy: str, cold: bool) -> dict[str, Any] | None:
        return next(
            (r for r in rows if (r["world"], r["strategy"], r["cold"]) == (world, strategy, cold)),
            None,
        )

    print(
        f"\nmodel bytes (fp32) {model_bytes / GiB:.2f} GiB; file bytes {file_bytes / GiB:.2f} GiB; "
        "memory = peak above each rank's pre-load RSS, summed over ranks; medians"
    )
    print(
        f"{'W':>2} {'strategy':<8} {'cache':<5} {'wall s':>7} {'x read':>6} {'x fill':>6} "
        f"{'peak RSS GiB':>12} {'x model':>8} {'anon GiB':>9} {'file GiB':>9} "
        f"{'after GiB':>9} {'read GiB':>9} {'file/rank x files':>17}"
    )
    for r in rows:
        read = find(r["world"], "read", r["cold"])
        fill = find(r["world"], "fill", False)
        x_read = r["wall_s"] / read["wall_s"] if read else float("nan")
        x_fill = r["wall_s"] / fill["wall_s"] if fill else float("nan")
        print(
            f"{r['world']:>2} {r['strategy']:<8} {'cold' if r['cold'] else 'warm':<5} "
            f"{r['wall_s']:>7.2f} {x_read:>6.2f} {x_fill:>6.2f} "
            f"{r['peak_rss'] / GiB:>12.2f} {r['peak_rss'] / model_bytes:>8.2f} "
            f"{r['peak_anon'] / GiB:>9.2f} {r['peak_file'] / GiB:>9.2f} "
            f"{r['after_rss'] / GiB:>9.2f} {r['read_bytes'] / GiB:>9.2f} "
            f"{r['peak_file_rank'] / file_bytes:>17.2f}"
        )
    print("\nratios (sharded / baseline), per W and cache state:")
    for r in rows:
        if r["strategy"] != "sharded":
            continue
        cache = "cold" if r["cold"] else "warm"
        for base in ("naive", "rank0", "read"):
            b = find(r["world"], base, r["cold"])
            if b is None:
                continue
            wall = r["wall_s"] / b["wall_s"]
            mem = "" if base == "read" else f"peak RSS {r['peak_rss'] / b['peak_rss']:.2f}x, "
            print(f"  W={r['world']} {cache}: vs {base}: {mem}wall {wall:.2f}x")
    print(
        "targets: sharded peak RSS summed <= 1.5x model bytes; sharded wall <= 1.5x the "
        "sequential read (x read: cold vs cold read, warm vs warm read; x fill: vs rank 0 "
        "alone filling fresh fp32 memory from the cached files)"
    )


if __name__ == "__main__":
    sys.exit(main())
