"""Run a function on W gloo ranks in fresh processes (tests and benchmarks; no Ray).

``fn`` must be importable by name (a module-level function), because the ranks
are spawned, not forked: a forked child would inherit the parent's memory and
make per-rank RSS figures meaningless.
"""

from __future__ import annotations

import io
import os
import socket
import traceback
from collections.abc import Callable
from typing import Any

RankFn = Callable[[int, int, Any], Any]


def _rank_main(rank: int, world: int, port: int, fn: RankFn, arg: Any, queue: Any) -> None:
    import torch
    import torch.distributed as dist

    try:
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
        )
        try:
            # Bytes, not tensors: torch's queue would pass tensors as shared-memory
            # handles that die with this process.
            buf = io.BytesIO()
            torch.save(fn(rank, world, arg), buf)
            queue.put((rank, "ok", buf.getvalue()))
        finally:
            if dist.is_initialized():  # vLLM's engine tears the world down with itself
                dist.destroy_process_group()
    except BaseException:
        queue.put((rank, "error", traceback.format_exc()))
        raise


def run_ranks(fn: RankFn, world: int, arg: Any = None, timeout_s: float = 600.0) -> list[Any]:
    """``[fn(rank, world, arg) for each rank]``, each in its own spawned process."""
    import multiprocessing as mp
    import queue as queue_mod

    import torch

    ctx = mp.get_context("spawn")
    results: Any = ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    procs = [
        ctx.Process(target=_rank_main, args=(r, world, port, fn, arg, results), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    try:
        while len(out) < world:
            try:
                rank, status, value = results.get(timeout=timeout_s)
            except queue_mod.Empty:
                raise TimeoutError(f"ranks did not finish in {timeout_s} s") from None
            if status == "error":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            out[rank] = torch.load(io.BytesIO(value), weights_only=False)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [out[r] for r in range(world)]
