"""The driver's data path at scale: the index (grpo_trainer.dataset) against the loader it
replaced (the baseline, kept here: every row read into Python objects, every image's
bytes held in the driver, every prompt counted one after another).

For each size, a parquet of distinct JPEGs in EasyR1's layout (problem with an
``<image>`` marker, answer, images as ``{bytes, path}``; row groups of 256 rows, as
Hugging Face datasets writes image data) is written once; then, each in a fresh process
(its peak RSS is the process's own; "child MiB" is the largest child process's peak: the
pass's processes, and what the tokenizer's import starts, ~470 MiB even for the baseline):

* ``baseline``: the old loader, then the first batch drawn;
* ``index-first``: the index with the length pass across ``--workers`` processes, kept
  under a fresh checkpoint dir, then the first batch drawn and read as a rank reads it;
* ``index-second``: the same with the kept index (a restart).

"Seconds to the first rollout" is the driver's data path before its first ``generate``:
load, the first batch drawn, and that batch's rows read. The pass's processes' peak RSS
(each holds the tokenizer and processor) is reported apart from the driver's.

    .venv/bin/python bench/bench_data.py [--rows 10000,50000,200000 --workers 2]

Prints one JSON line per measurement, then a table with the ratios to the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BATCH = 512  # prompts a step (rollout_batch_size)
IMAGE_SIDE = 224  # distinct 224 x 224 JPEGs (smooth: ~10 KiB each, 2 GiB at 200k rows)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default="10000,50000,200000")
    p.add_argument("--workers", type=int, default=2, help="processes of the length pass")
    p.add_argument("--side", type=int, default=IMAGE_SIDE, help="image side in pixels")
    p.add_argument("--dir", default=None, help="where the datasets go (default: a temp dir)")
    p.add_argument("--skip-baseline-over", type=int, default=10**9,
                   help="leave the baseline out above this many rows")
    p.add_argument("--measure", default=None, help=argparse.SUPPRESS)
    p.add_argument("--file", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    p.add_argument("--ckpt", default=None, help=argparse.SUPPRESS)
    return p.parse_args()


def write_dataset(path: Path, rows: int, side: int) -> None:
    """Distinct JPEGs: a random base image per 1,000 rows with the row's number drawn in."""
    import io

    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image, ImageDraw
    from rich.progress import Progress

    rng = np.random.default_rng(0)
    schema = pa.schema([("problem", pa.string()), ("answer", pa.string()),
                        ("images", pa.list_(pa.struct([("bytes", pa.binary()),
                                                       ("path", pa.string())])))])
    with pq.ParquetWriter(path, schema) as w, Progress() as bar:
        task = bar.add_task(f"writing {path.name}", total=rows)
        base = None
        for start in range(0, rows, 256):
            problems, answers, images = [], [], []
            for i in range(start, min(rows, start + 256)):
                if i % 1000 == 0:  # coarse noise, upscaled: a photo-like JPEG size
                    noise = rng.integers(0, 256, (side // 8, side // 8, 3), dtype=np.uint8)
                    base = Image.fromarray(noise).resize((side, side), Image.Resampling.BICUBIC)
                assert base is not None
                im = base.copy()
                ImageDraw.Draw(im).text((8, 8), str(i), fill=(255, 255, 255))
                buf = io.BytesIO()
                im.save(buf, format="JPEG", quality=90)
                problems.append(f"<image>How many objects are in picture {i}?")
                answers.append(str(i % 10))
                images.append([{"bytes": buf.getvalue(), "path": None}])
            w.write_table(pa.table({"problem": problems, "answer": answers, "images": images},
                                   schema=schema), row_group_size=256)
            bar.advance(task, len(problems))


def _baseline(cfg: Any, count: Any) -> tuple[int, int]:
    """The loader before the index: every row as Python objects, images' bytes held."""
    import pyarrow.parquet as pq

    from grpo_trainer.data import Record

    records: list[Record] = []
    for path in cfg.data.train_files:
        for i, row in enumerate(pq.read_table(path).to_pylist()):
            records.append(Record(len(records), str(row["problem"]), str(row["answer"]),
                                  [bytes(x["bytes"]) for x in row["images"] or []],
                                  source=path, row=i))
    kept = [r for r in records if count(r) <= cfg.data.max_prompt_length]
    first = kept[:BATCH]  # drawn from the records in memory
    return len(kept), len(first)


def _index(cfg: Any, count: Any, ckpt: Path) -> tuple[int, int]:
    from grpo_trainer.dataset import PromptDataset, StatefulLoader, read_records

    ds = PromptDataset(cfg.data.train_files, cfg.data, prompt_tokens=count, config=cfg,
                       cache_dir=ckpt)
    loader = StatefulLoader(ds, BATCH, cfg.data.seed, cfg.data.shuffle)
    refs = loader.next_batch()
    return len(ds), len(read_records(refs, cfg.data))  # as a rank reads its share


def measure(args: argparse.Namespace) -> None:
    from grpo_trainer.algorithm.samples import prompt_token_counter
    from grpo_trainer.config import build_config

    cfg = build_config({"model": {"path": args.model},
                        "data": {"train_files": [args.file], "max_prompt_length": 4096,
                                 "length_workers": args.workers}}, environ={})
    t0 = time.perf_counter()
    count = prompt_token_counter(cfg)
    if args.measure == "baseline":
        rows, first = _baseline(cfg, count)
    else:
        rows, first = _index(cfg, count, Path(args.ckpt))
    seconds = time.perf_counter() - t0
    self_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({"mode": args.measure, "rows": rows, "first_batch": first,
                      "seconds_to_first_rollout": round(seconds, 2),
                      "driver_peak_rss_mib": round(self_kib / 1024, 1),
                      "pass_process_peak_rss_mib": round(children_kib / 1024, 1)}))


def run(mode: str, file: Path, model: Path, ckpt: Path, workers: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--measure", mode, "--file", str(file), "--model",
         str(model), "--ckpt", str(ckpt), "--workers", str(workers)],
        check=False, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"{mode} on {file.name} failed:\n{out.stderr[-4000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    args = parse_args()
    if args.measure:
        measure(args)
        return
    from grpo_testkit.tiny_models import build_tiny_qwen2_5_vl

    root = Path(args.dir or tempfile.mkdtemp(prefix="bench-data-"))
    root.mkdir(parents=True, exist_ok=True)
    model = Path(build_tiny_qwen2_5_vl(root / "model"))
    print(f"load average {os.getloadavg()[0]:.2f}, cpus {os.cpu_count()}", flush=True)
    table = []
    for rows in (int(x) for x in args.rows.split(",")):
        file = root / f"rows-{rows}.parquet"
        if not file.exists():
            write_dataset(file, rows, args.side)
        mib = file.stat().st_size / 2**20
        ckpt = Path(tempfile.mkdtemp(dir=root, prefix=f"ckpt-{rows}-"))
        results = {}
        for mode in ("baseline", "index-first", "index-second"):
            if mode == "baseline" and rows > args.skip_baseline_over:
                continue
            r = run(mode, file, model, ckpt, args.workers)
            r.update(file_mib=round(mib, 1), load=round(os.getloadavg()[0], 2))
            print(json.dumps(r), flush=True)
            results[mode] = r
        table.append((rows, mib, results))
    print(f"\n{'rows':>8} {'file MiB':>9} {'mode':>13} {'s to 1st':>9} {'driver MiB':>11} "
          f"{'child MiB':>9} {'x time':>7} {'x RSS':>6}")
    for rows, mib, results in table:
        base = results.get("baseline")
        for mode, r in results.items():
            ratio_t = (f"{base['seconds_to_first_rollout'] / r['seconds_to_first_rollout']:.1f}"
                       if base else "-")
            ratio_m = (f"{base['driver_peak_rss_mib'] / r['driver_peak_rss_mib']:.1f}"
                       if base else "-")
            print(f"{rows:>8} {mib:>9.0f} {mode:>13} {r['seconds_to_first_rollout']:>9.1f} "
                  f"{r['driver_peak_rss_mib']:>11.0f} {r['pass_process_peak_rss_mib']:>9.0f} "
                  f"{ratio_t:>7} {ratio_m:>6}")


if __name__ == "__main__":
    main()
