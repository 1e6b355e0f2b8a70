"""Checkpoint save/load bandwidth vs the disk's own, vs torch.save; async save's blocking time.

Builds a Qwen2 of a few hundred MB (random weights, built here), sets it up as the
trainer does (the real ``Worker``: FSDP2 on one gloo rank, AdamW with its state
filled by one step) and, in each round, in alternating order:

- **ours**: ``DCPCheckpointer`` saving a step (DCP shards + RNG/scheduler + trainer
  state + config, every file fsynced and xxh3-hashed while written, manifest,
  tracker) and resuming from it with a cold page cache (xxh3 check of every file,
  then DCP load through the direct reader, ``set_state_dict``);
- **raw**: the same bytes written sequentially to one file with plain ``write`` +
  ``fsync``, and read back cold - the machine's own bandwidth;
- **torch.save**: the full gathered state dict (``get_state_dict(full_state_dict=True,
  cpu_offload=True)``) saved to one file + fsync, and ``torch.load`` + ``set_state_dict``;
- **async**: ``checkpoint.async_save``: the time ``maybe_save`` blocks training,
  against a synchronous save's time.

With ``--store`` (``checkpoint.store``, the testbed's S3 server on loopback) each round is
instead: **ours** saving a step through the store (local write, upload, manifest, tracker:
what the final save waits for) and, after the local directory is removed (a new pod),
resuming from the store alone (listing, fetch, digest check, load); against **raw**, the
same objects' bytes put and got back one single-part request each.

Usage::

    .venv/bin/python bench/bench_checkpoint.py [--hidden 1024 --layers 8 --rounds 3]

Prints one line per measurement and a JSON summary with the ratios.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dir", default=None, help="where to write (default: a temp dir)")
    p.add_argument("--store", action="store_true",
                   help="checkpoint.store: ours against the testbed's S3 server (versitygw), "
                        "vs a raw single-part upload and download of the same bytes")
    return p.parse_args()


def drop_cache(path: Path) -> None:
    """Evict a file (or a directory's files) from the page cache; clean pages only."""
    from grpo_testkit.loading import evict_page_cache

    evict_page_cache([path] if path.is_file() else [p for p in path.iterdir() if p.is_file()])


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def raw_write(path: Path, chunks: list[bytes]) -> float:
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for c in chunks:
            f.write(c)
        f.flush()
        os.fsync(f.fileno())
    return time.perf_counter() - t0


def raw_read(path: Path) -> float:
    drop_cache(path)
    t0 = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(8 << 20)
        while f.readinto(buf):
            pass
    return time.perf_counter() - t0


def main() -> int:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import torch
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )

    from grpo_testkit.configs import text_config
    from grpo_testkit.crash import LocalGroup
    from grpo_testkit.datasets import write_text_task
    from grpo_testkit.tiny_models import build_tiny_qwen2
    from grpo_trainer.checkpointing.dcp import DCPCheckpointer
    from grpo_trainer.config import build_config
    from grpo_trainer.driver.driver import GRPOTrainer

    work = Path(args.dir or tempfile.mkdtemp(prefix="bench-ckpt-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"building a Qwen2 hidden={args.hidden} layers={args.layers} in {work}", flush=True)
    model = build_tiny_qwen2(work / "model", hidden=args.hidden, layers=args.layers)
    data = write_text_task(work / "t.jsonl")

    server: Any = None
    store: dict[str, Any] = {}
    if args.store:  # before the ranks: their store reads the keys from the environment
        from grpo_testbed.s3_server import REGION, standalone_s3_server

        server = standalone_s3_server(work / "s3")
        server.make_bucket("bench")
        os.environ.update(AWS_ACCESS_KEY_ID=server.access_key,
                          AWS_SECRET_ACCESS_KEY=server.secret_key)
        store = {"store": {"uri": "s3://bench/ckpt", "endpoint": server.endpoint,
                           "region": REGION, "path_style": True}}

    def config(name: str, async_save: bool) -> Any:
        raw = text_config(
            model,
            data,
            checkpoint={
                "dir": str(work / name),
                "keep": 1,
                "interval_steps": 1,
                "async_save": async_save,
                **store,
            },
            resources={"num_workers": 1, "cpus_per_worker": 2},
            actor={"dtype": "float32"},
        )
        return build_config(raw, environ={})

    cfg = config("ours", False)
    acfg = config("async", True)
    trainer = GRPOTrainer(cfg)
    group = LocalGroup(cfg)
    worker = group.workers[0]
    params = list(worker.state.actor.parameters())
    for p in params:  # real (not all-zero) Adam moments
        p.grad = torch.randn_like(p) * 1e-3
    worker.state.optimizer.step()
    worker.state.optimizer.zero_grad(set_to_none=True)
    n_params = sum(p.numel() for p in params)
    print(f"{n_params / 1e6:.1f} M parameters; fp32 weights + Adam moments", flush=True)
    logging.getLogger("grpo_trainer").setLevel(logging.WARNING)

    res: dict[str, list[float]] = {
        k: []
        for k in (
            "ours_save",
            "ours_load",
            "ours_verify",
            "raw_write",
            "raw_read",
            "torch_save",
            "torch_load",
            "sync_save",
            "async_blocked",
        )
    }
    step = 0
    total_bytes = 0

    def ours() -> None:
        nonlocal step, total_bytes
        step += 1
        ck = DCPCheckpointer(cfg)
        t0 = time.perf_counter()
        ck.maybe_save(step, group, trainer.loader, final=True)
        dt = time.perf_counter() - t0
        sd = work / "ours" / f"step-{step}"
        total_bytes = dir_bytes(sd)
        res["ours_save"].append(dt)
        drop_cache(sd)
        ck2 = DCPCheckpointer(cfg)
        t0 = time.perf_counter()
        assert ck2.restore(group, trainer.loader) == step
        res["ours_load"].append(time.perf_counter() - t0)
        res["ours_verify"].append(ck2.last_restore["verify_s"])
        print(
            f"ours       save {dt:6.2f} s  load {res['ours_load'][-1]:6.2f} s "
            f"(xxh3 check {ck2.last_restore['verify_s']:.2f} s, "
            f"{ck2.last_restore['direct_items']:.0f} tensors read in place, "
            f"{ck2.last_restore['stock_items']:.0f} via torch.load)  {total_bytes / 1e6:.0f} MB",
            flush=True,
        )

    def raw() -> None:
        sd = work / "ours" / f"step-{step}"
        chunks = [p.read_bytes() for p in sorted(sd.iterdir()) if p.is_file()]
        target = work / "raw.bin"
        w = raw_write(target, chunks)
        del chunks
        r = raw_read(target)
        target.unlink()
        res["raw_write"].append(w)
        res["raw_read"].append(r)
        print(f"raw        write {w:5.2f} s  read {r:6.2f} s", flush=True)

    def torch_save() -> None:
        target = work / "full.pt"
        opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
        t0 = time.perf_counter()
        msd, osd = get_state_dict(worker.state.actor, worker.state.optimizer, options=opts)
        with open(target, "wb") as f:
            torch.save({"model": msd, "optim": osd}, f)
            f.flush()
            os.fsync(f.fileno())
        w = time.perf_counter() - t0
        del msd, osd
        drop_cache(target)
        t0 = time.perf_counter()
        state = torch.load(target, weights_only=True)
        set_state_dict(
            worker.state.actor,
            worker.state.optimizer,
            model_state_dict=state["model"],
            optim_state_dict=state["optim"],
            options=StateDictOptions(full_state_dict=True),
        )
        r = time.perf_counter() - t0
        del state
        target.unlink()
        res["torch_save"].append(w)
        res["torch_load"].append(r)
        print(f"torch.save save {w:6.2f} s  load {r:6.2f} s", flush=True)

    def async_save() -> None:
        nonlocal step
        step += 1
        ck = DCPCheckpointer(acfg)
        t0 = time.perf_counter()
        ck.maybe_save(step, group, trainer.loader, final=False)
        blocked = time.perf_counter() - t0
        ck.wait(group)
        total = time.perf_counter() - t0
        step += 1
        sync = DCPCheckpointer(cfg)
        t0 = time.perf_counter()
        sync.maybe_save(step, group, trainer.loader, final=True)
        res["sync_save"].append(time.perf_counter() - t0)
        res["async_blocked"].append(blocked)
        print(
            f"async      blocked {blocked:5.2f} s (rank snapshot "
            f"{ck.last_save['rank_blocked_s']:.2f} s; written in {total:.2f} s)  "
            f"sync save {res['sync_save'][-1]:.2f} s",
            flush=True,
        )

    if server is not None:
        return store_rounds(args, cfg, group, trainer, server, work, n_params)
    # The first async save allocates the staging buffer it then reuses: not steady state.
    first = DCPCheckpointer(acfg)
    t0 = time.perf_counter()
    first.maybe_save(1000, group, trainer.loader, final=False)
    first_blocked = time.perf_counter() - t0
    first.wait(group)
    print(f"first async save blocked {first_blocked:.2f} s (allocates the staging buffer)")
    for r in range(args.rounds):
        print(f"-- round {r + 1}/{args.rounds}", flush=True)
        # raw writes the bytes ours just wrote, so ours goes first; the rest alternate.
        order = (
            [ours, raw, torch_save, async_save]
            if r % 2 == 0
            else [ours, async_save, torch_save, raw]
        )
        for fn in order:
            fn()
        shutil.rmtree(work / "async", ignore_errors=True)

    med = {k: statistics.median(v) for k, v in res.items()}
    mb = total_bytes / 1e6
    summary = {
        "state_mb": round(mb, 1),
        "parameters_m": round(n_params / 1e6, 1),
        "ours_save_mb_s": round(mb / med["ours_save"], 1),
        "ours_load_mb_s": round(mb / med["ours_load"], 1),
        "raw_write_mb_s": round(mb / med["raw_write"], 1),
        "raw_read_mb_s": round(mb / med["raw_read"], 1),
        "torch_save_mb_s": round(mb / med["torch_save"], 1),
        "torch_load_mb_s": round(mb / med["torch_load"], 1),
        "save_vs_raw": round(med["raw_write"] / med["ours_save"], 2),
        "load_vs_raw": round(med["raw_read"] / med["ours_load"], 2),
        "save_vs_torch_save": round(med["torch_save"] / med["ours_save"], 2),
        "load_vs_torch_load": round(med["torch_load"] / med["ours_load"], 2),
        "async_blocked_s": round(med["async_blocked"], 3),
        "sync_save_s": round(med["sync_save"], 3),
        "async_blocked_vs_sync": round(med["async_blocked"] / med["sync_save"], 3),
        "first_async_blocked_s": round(first_blocked, 3),
        "load_verify_s": round(med["ours_verify"], 2),
        "rounds": args.rounds,
        "runs": {k: [round(x, 3) for x in v] for k, v in res.items()},
    }
    print(json.dumps(summary, indent=1))
    group.shutdown()
    trainer.close()
    if args.dir is None:
        shutil.rmtree(work, ignore_errors=True)
    ok = summary["save_vs_raw"] >= 0.6 and summary["load_vs_raw"] >= 0.6
    ok = ok and summary["async_blocked_vs_sync"] < 0.1
    print(
        f"save {summary['save_vs_raw']:.2f}x raw, load {summary['load_vs_raw']:.2f}x raw "
        f"(target >= 0.6); async blocks {summary['async_blocked_vs_sync']:.1%} of a sync save "
        f"(target < 10%): {'OK' if ok else 'MISSED'}"
    )
    return 0 if ok else 1


def store_rounds(args: argparse.Namespace, cfg: Any, group: Any, trainer: Any, server: Any,
                 work: Path, n_params: int) -> int:
    """``--store``: ours through the S3 store vs raw single-part requests, in turns."""
    from grpo_api.trainer_config import ObjectStoreConfig
    from grpo_trainer.checkpointing.dcp import DCPCheckpointer
    from grpo_trainer.object_store import ObjectStore

    assert cfg.checkpoint.store is not None
    client = ObjectStore(cfg.checkpoint.store)
    raw_client = ObjectStore(ObjectStoreConfig(**{**cfg.checkpoint.store.model_dump(),
                                                  "uri": "s3://bench/raw"}))
    res: dict[str, list[float]] = {k: [] for k in ("save", "load", "raw_up", "raw_down")}
    mb = 0.0
    for r in range(args.rounds):
        step = r + 1
        t0 = time.perf_counter()
        DCPCheckpointer(cfg).maybe_save(step, group, trainer.loader, final=True)
        res["save"].append(time.perf_counter() - t0)
        objects = {k: v for k, v in client.sizes(f"step-{step}/").items()}
        mb = sum(objects.values()) / 1e6
        shutil.rmtree(work / "ours")  # a new pod: nothing local
        t0 = time.perf_counter()
        assert DCPCheckpointer(cfg).restore(group, trainer.loader) == step
        res["load"].append(time.perf_counter() - t0)
        blobs = {k.split("/", 1)[1]: client.get_bytes(k) or b"" for k in objects}
        t0 = time.perf_counter()
        for name, data in blobs.items():
            raw_client.put_bytes(name, data)
        res["raw_up"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for name in blobs:
            raw_client.get_bytes(name)
        res["raw_down"].append(time.perf_counter() - t0)
        raw_client.delete(list(blobs))
        del blobs
        print(f"round {step}: ours save {mb / res['save'][-1]:6.0f} MB/s, load "
              f"{mb / res['load'][-1]:6.0f} MB/s; raw up {mb / res['raw_up'][-1]:6.0f} MB/s, "
              f"down {mb / res['raw_down'][-1]:6.0f} MB/s ({mb:.0f} MB)", flush=True)
    med = {k: statistics.median(v) for k, v in res.items()}
    summary = {
        "state_mb": round(mb, 1), "parameters_m": round(n_params / 1e6, 1),
        "store_save_mb_s": round(mb / med["save"], 1),
        "store_load_mb_s": round(mb / med["load"], 1),
        "raw_up_mb_s": round(mb / med["raw_up"], 1),
        "raw_down_mb_s": round(mb / med["raw_down"], 1),
        "save_vs_raw_upload": round(med["raw_up"] / med["save"], 2),
        "load_vs_raw_download": round(med["raw_down"] / med["load"], 2),
        "load_end": round(os.getloadavg()[0], 2), "rounds": args.rounds,
        "runs": {k: [round(x, 3) for x in v] for k, v in res.items()},
    }
    print(json.dumps(summary, indent=1))
    group.shutdown()
    trainer.close()
    server.stop()
    if args.dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
