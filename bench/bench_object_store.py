"""Which S3 library the trainer uses: upload and download MB/s of checkpoint-shaped files
against the testbed's real S3 server (versitygw on loopback), every candidate in one run.

The shape: a save's files are a few large DCP shards per rank plus small ones (RNG state,
trainer state, manifest); a load reads the same back. Each round, in rotating order, every
library uploads the same files from local disk into its own prefix and downloads them back
to local disk (fsynced, so the figure includes the disk); **raw** is the baseline: one
plain ``PutObject``/``GetObject`` per file (no multipart, no concurrency), what a
hand-written client does, sent through obstore's single-part calls.

Candidates: ``obstore`` (Rust object_store: multipart with concurrent parts) and
``s3torchconnector`` (AWS's, on the CRT). boto3's transfer manager cannot be installed
beside kubernetes 37 (python-dateutil 4 against botocore's < 3): its figures in
docs/benchmarks.md come from a separate virtualenv. Ones not installed are reported.

Usage::

    .venv/bin/python bench/bench_object_store.py [--mib 128 --files 4 --rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grpo_testbed.s3_server import REGION, S3Server, standalone_s3_server

Transfer = tuple[Callable[[Path, str], None], Callable[[str, Path], None]]


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, default=128, help="size of each large file")
    p.add_argument("--files", type=int, default=4, help="large files (a rank's shards)")
    p.add_argument("--small", type=int, default=16, help="small files of 64 KiB")
    p.add_argument("--rounds", type=int, default=3)
    return p.parse_args()


def write_durable(path: Path, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def s3_store(s: S3Server, bucket: str) -> Any:
    from obstore.store import S3Store

    return S3Store(bucket, endpoint=s.endpoint, region=REGION, access_key_id=s.access_key,
                   secret_access_key=s.secret_key, virtual_hosted_style_request=False,
                   client_options={"allow_http": True})


def raw(s: S3Server, bucket: str) -> Transfer:
    import obstore

    store = s3_store(s, bucket)

    def up(src: Path, key: str) -> None:
        obstore.put(store, key, src.read_bytes(), use_multipart=False)

    def down(key: str, dst: Path) -> None:
        write_durable(dst, bytes(obstore.get(store, key).bytes()))

    return up, down


def obstore_transfer(s: S3Server, bucket: str) -> Transfer:
    import obstore

    store = s3_store(s, bucket)

    def up(src: Path, key: str) -> None:
        obstore.put(store, key, src)

    def down(key: str, dst: Path) -> None:
        with open(dst, "wb") as f:
            for chunk in obstore.get(store, key).stream(min_chunk_size=8 << 20):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())

    return up, down


def s3torch_transfer(s: S3Server, bucket: str) -> Transfer:
    from s3torchconnector import S3ClientConfig
    from s3torchconnector._s3client import S3Client

    os.environ.update(AWS_ACCESS_KEY_ID=s.access_key, AWS_SECRET_ACCESS_KEY=s.secret_key)
    c = S3Client(REGION, endpoint=s.endpoint, s3client_config=S3ClientConfig(
        force_path_style=True))

    def up(src: Path, key: str) -> None:
        w = c.put_object(bucket, key)
        with open(src, "rb") as f:
            while chunk := f.read(8 << 20):
                w.write(chunk)
        w.close()

    def down(key: str, dst: Path) -> None:
        r = c.get_object(bucket, key)
        with open(dst, "wb") as f:
            while chunk := r.read(8 << 20):
                f.write(chunk)
            f.flush()
            os.fsync(f.fileno())

    return up, down


CANDIDATES: dict[str, Callable[[S3Server, str], Transfer]] = {
    "raw": raw, "obstore": obstore_transfer, "s3torchconnector": s3torch_transfer,
}


def main() -> int:
    args = parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-s3-"))
    server = standalone_s3_server(work / "server")
    try:
        bucket = server.make_bucket("bench")
        src = work / "src"
        src.mkdir()
        rng = os.urandom
        files = {f"__{i}_0.distcp": rng(args.mib << 20) for i in range(args.files)}
        files.update({f"small-{i}.pt": rng(64 << 10) for i in range(args.small)})
        for name, data in files.items():
            write_durable(src / name, data)
        total_mb = sum(len(d) for d in files.values()) / 1e6
        print(f"{len(files)} files, {total_mb:.0f} MB; server {server.endpoint}; "
              f"load {os.getloadavg()[0]:.2f}", flush=True)
        transfers: dict[str, Transfer] = {}
        for name, make in CANDIDATES.items():
            try:
                transfers[name] = make(server, bucket)
            except ImportError as exc:
                print(f"{name}: not installed ({exc.name})")
        up: dict[str, list[float]] = {n: [] for n in transfers}
        down: dict[str, list[float]] = {n: [] for n in transfers}
        order = list(transfers)
        for r in range(args.rounds):
            for name in order[r % len(order):] + order[: r % len(order)]:
                put, get = transfers[name]
                prefix = f"{name}/round-{r}"
                t0 = time.perf_counter()
                for f in files:
                    put(src / f, f"{prefix}/{f}")
                up[name].append(total_mb / (time.perf_counter() - t0))
                dst = work / "dst"
                shutil.rmtree(dst, ignore_errors=True)
                dst.mkdir()
                t0 = time.perf_counter()
                for f in files:
                    get(f"{prefix}/{f}", dst / f)
                down[name].append(total_mb / (time.perf_counter() - t0))
                assert all((dst / f).read_bytes() == d for f, d in files.items()), name
                print(f"round {r} {name:17s} upload {up[name][-1]:7.0f} MB/s  "
                      f"download {down[name][-1]:7.0f} MB/s", flush=True)
        summary = {
            n: {"upload_mb_s": round(statistics.median(up[n])),
                "download_mb_s": round(statistics.median(down[n])),
                "upload_vs_raw": round(statistics.median(up[n]) / statistics.median(up["raw"]), 2),
                "download_vs_raw": round(
                    statistics.median(down[n]) / statistics.median(down["raw"]), 2)}
            for n in transfers
        }
        print(json.dumps({"mb": round(total_mb), "load_end": round(os.getloadavg()[0], 2),
                          "median": summary}, indent=1))
    finally:
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
