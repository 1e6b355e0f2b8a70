"""The disaggregated weight sync: rank 0 broadcasts the full weights to every rollout
engine over a process group of its own (rank 0 is its rank 0, engine ``e`` its rank
``e + 1``), in buckets of at most ``WEIGHT_SYNC_BUCKET_BYTES``.

The group lives beside the ranks' default group, so it is built without
``init_process_group`` (which allows one world per process): a ``ProcessGroup`` over a
``PrefixStore`` of a ``TCPStore`` that rank 0 serves on a port the OS picked when it
bound it (held from then on, as the ranks' own rendezvous does, worker.py). Every
(re)creation of the group, after an engine was replaced, takes a new prefix on the same
store. The backend is ``devices.weight_sync_backend``'s: gloo on the CPU, NCCL on GPUs.

Each bucket is announced by a small JSON header (names, shapes, dtype) broadcast as
bytes, then sent as one flat tensor; an ``{"end": true}`` header closes the stream.

A push fails fast when a member is lost on the way. Every member waits for each of the
push's broadcasts on the CPU, for at most ``push_timeout_s`` of its bytes, and abandons
the group past it (``abandon``); the driver then replaces the lost engine and pushes
again. Without that, NCCL would hang: ``Work.wait()`` without a timeout only makes the
current stream wait and returns at once, the error comes from the watchdog after the
group's timeout, which then crashes the process (rank 0's: the attempt). torch 2.13:
``include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp`` (``WorkNCCL::wait``: "Same
as calling synchronize() for NCCL work if timeout is not set. Otherwise, it will block
the CPU thread until the NCCL work is completed or timed out. If timeout, exception will
be thrown.") and ``distributed/distributed_c10d.py`` ``_set_pg_timeout`` ("collectives
will be aborted asynchronously and the process will crash").
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from grpo_api.contract import WEIGHT_SYNC_BUCKET_BYTES

log = logging.getLogger(__name__)

T = TypeVar("T")

# The slowest path a push may take between rank 0 and an engine: 1 Gbit/s, below any
# datacenter NIC (the rollout pods' own network included) and below gloo's TCP on a
# loaded host; a broadcast slower than this is taken for a lost member.
PUSH_FLOOR_BYTES_PER_S = 125e6
# The least any one broadcast of a push may take: covers the first collective of a new
# group (NCCL builds its communicator there) and rank 0's gather of the next bucket,
# which the engines wait through.
PUSH_TIMEOUT_MIN_S = 120.0


@dataclass(frozen=True)
class WeightGroupSpec:
    """How every member joins one incarnation of the weight group."""

    address: str  # rank 0's host
    port: int  # its store's port
    prefix: str  # this incarnation's keys on the store
    world: int  # 1 + the engines
    backend: str  # devices.weight_sync_backend
    timeout_s: float  # the group's own (NCCL's watchdog); longer than any push_timeout_s
    push_timeout_min_s: float = PUSH_TIMEOUT_MIN_S  # push_timeout_s's floor (tests lower it)


# -- the pure part ------------------------------------------------------------------------
def buckets(items: Iterable[T], size_of: Callable[[T], int], key: Callable[[T], Hashable],
            limit: int) -> Iterator[list[T]]:
    """Consecutive ``items`` grouped while their sizes add up to at most ``limit`` and
    their ``key`` (the dtype: one flat tensor per bucket) is the same; an item bigger
    than ``limit`` is a bucket of its own. Lazy: the gather behind ``items`` runs one
    bucket ahead of the broadcast at most."""
    current: list[T] = []
    size = 0
    for item in items:
        n = size_of(item)
        if current and (size + n > limit or key(item) != key(current[0])):
            yield current
            current, size = [], 0
        current.append(item)
        size += n
    if current:
        yield current


def push_timeout_s(nbytes: int, minimum_s: float = PUSH_TIMEOUT_MIN_S,
                   floor_bytes_per_s: float = PUSH_FLOOR_BYTES_PER_S) -> float:
    """How long one broadcast of ``nbytes`` may take before its member gives the push
    up: its bytes at the bandwidth floor, and never less than ``minimum_s``."""
    return max(minimum_s, nbytes / floor_bytes_per_s)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a weight bucket header")
    return dtype


# -- the process group --------------------------------------------------------------------
def open_store(timeout_s: float) -> dist.TCPStore:
    """Rank 0's store: bound to a port the OS picks, and held."""
    return dist.TCPStore("0.0.0.0", 0, None, True, timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def join_group(spec: WeightGroupSpec, rank: int, store: dist.Store | None = None
               ) -> dist.ProcessGroup:
    """This member's handle on the group (a collective: every member calls it)."""
    timeout = timedelta(seconds=spec.timeout_s)
    if store is None:
        store = dist.TCPStore(spec.address, spec.port, None, False, timeout)
    prefixed = dist.PrefixStore(spec.prefix, store)
    pg = dist.ProcessGroup(prefixed, rank, spec.world)
    if spec.backend == "nccl":
        opts = dist.ProcessGroupNCCL.Options()
        # The watchdog (it crashes the process) only past the members' own CPU waits,
        # after which they abort the group: a push's broadcasts take at most
        # push_timeout_s, the minimum unless a bucket is over 15 GB.
        opts._timeout = max(timeout, timedelta(seconds=2 * spec.push_timeout_min_s))
        backend: Any = dist.ProcessGroupNCCL(prefixed, rank, spec.world, opts)
        kind, device = dist.ProcessGroup.BackendType.NCCL, torch.device("cuda")
    else:
        backend = dist.ProcessGroupGloo(prefixed, rank, spec.world, timeout)
        kind, device = dist.ProcessGroup.BackendType.GLOO, torch.device("cpu")
    pg._set_default_backend(kind)
    backend._set_sequence_number_for_group()
    pg._register_backend(device, kind, backend)
    return pg


def group_device(backend: str) -> torch.device:
    """Where a member's buffers for ``backend`` live: this process's GPU for NCCL, else
    the host (gloo), whatever device the weights come from."""
    if backend == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def abandon(pg: dist.ProcessGroup, device: torch.device) -> None:
    """Give a broken push's group up (the caller then drops its last reference and
    calls ``released``). NCCL: ``abort`` (ncclCommAbort) ends the broadcast still queued
    on this member's GPU, which would otherwise block its stream and, at the group's
    timeout, crash the process through the watchdog. gloo: nothing, a timed-out op has
    already ended (``_broadcast`` gives it the same timeout), and ``abort`` would leave
    the peers waiting where dropping the group closes its connections."""
    if device.type == "cuda":
        try:
            pg.abort()
        except Exception as err:  # already torn down: nothing left to end
            log.warning("aborting the weight group: %s", str(err)[:200])


def released() -> None:
    """After the last reference to a group was dropped: collect it now. Its destructor
    closes its connections, so the peers' pending collectives fail at once instead of
    waiting out the timeout (a send to a dead engine failed, the others wait for the
    rest). gloo's ``abort`` and ``shutdown`` leave the peers waiting (test_weight_bus.py)."""
    gc.collect()


def _broadcast(pg: dist.ProcessGroup, tensor: torch.Tensor, minimum_s: float) -> None:
    """``tensor`` from rank 0 to every member, waited for on the CPU for at most
    ``push_timeout_s`` of its bytes (raises past it). gloo also gets it as the op's own
    timeout, so the op ends with the wait and the group can be dropped at once (its
    destructor waits for a pending op); NCCL does not, its watchdog would crash the
    process (the member aborts the group instead: ``abandon``)."""
    timeout = timedelta(seconds=push_timeout_s(tensor.numel() * tensor.element_size(),
                                               minimum_s))
    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    if tensor.device.type == "cpu":
        opts.timeout = timeout
    pg.broadcast([tensor], opts).wait(timeout)


def _broadcast_json(pg: dist.ProcessGroup, obj: Any, device: torch.device,
                    minimum_s: float) -> Any:
    """``obj`` from rank 0 to every member (the others pass None)."""
    root = pg.rank() == 0
    data = json.dumps(obj).encode() if root else b""
    length = torch.tensor([len(data)], dtype=torch.int64, device=device)
    _broadcast(pg, length, minimum_s)
    if root:
        payload = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    else:
        payload = torch.empty(int(length.item()), dtype=torch.uint8, device=device)
    _broadcast(pg, payload, minimum_s)
    return obj if root else json.loads(payload.cpu().numpy().tobytes())


# -- the two ends -------------------------------------------------------------------------
def send_weights(
    pg: dist.ProcessGroup,
    weights: Iterable[tuple[str, torch.Tensor]],
    device: torch.device,
    bucket_bytes: int = WEIGHT_SYNC_BUCKET_BYTES,
    timeout_min_s: float = PUSH_TIMEOUT_MIN_S,
) -> int:
    """Rank 0: every (name, full tensor) of ``weights`` to the engines; the bytes sent.
    ``timeout_min_s``: the group's ``push_timeout_min_s``, as every member's."""
    sent = 0
    for bucket in buckets(weights, lambda w: w[1].numel() * w[1].element_size(),
                          lambda w: w[1].dtype, bucket_bytes):
        header = {"names": [n for n, _ in bucket],
                  "shapes": [list(t.shape) for _, t in bucket],
                  "dtype": _dtype_name(bucket[0][1].dtype)}
        _broadcast_json(pg, header, device, timeout_min_s)
        flat = torch.cat([t.detach().reshape(-1).to(device) for _, t in bucket])
        _broadcast(pg, flat, timeout_min_s)
        sent += flat.numel() * flat.element_size()
    _broadcast_json(pg, {"end": True}, device, timeout_min_s)
    return sent


def receive_weights(pg: dist.ProcessGroup, device: torch.device,
                    timeout_min_s: float = PUSH_TIMEOUT_MIN_S
                    ) -> Iterator[tuple[str, torch.Tensor]]:
    """An engine: (name, full tensor) as rank 0 sends them, bucket by bucket; the tensors
    are views of the bucket's buffer (``RolloutEngine.load_weights`` copies them)."""
    while True:
        header = _broadcast_json(pg, None, device, timeout_min_s)
        if header.get("end"):
            return
        shapes = [tuple(s) for s in header["shapes"]]
        sizes = [int(torch.Size(s).numel()) for s in shapes]
        flat = torch.empty(sum(sizes), dtype=_dtype(header["dtype"]), device=device)
        _broadcast(pg, flat, timeout_min_s)
        offset = 0
        for name, shape, n in zip(header["names"], shapes, sizes, strict=True):
            yield name, flat[offset : offset + n].view(shape)
            offset += n


class WeightSender:
    """A rank's end of the weight sync. Rank 0 serves the store, joins each incarnation
    of the group and broadcasts; every rank runs the gather (a collective over the
    ranks), so the others only drain the stream."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.store: dist.TCPStore | None = None
        self.pg: dist.ProcessGroup | None = None
        self.device = torch.device("cpu")
        self.timeout_min_s = PUSH_TIMEOUT_MIN_S

    def open(self, timeout_s: float) -> int:
        self.store = open_store(timeout_s)
        return int(self.store.port)

    def join(self, spec: WeightGroupSpec) -> None:
        self.pg = None
        released()
        self.pg = join_group(spec, 0, self.store)
        self.device = group_device(spec.backend)
        self.timeout_min_s = spec.push_timeout_min_s

    def push(self, weights: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """Send (rank 0) or drain (the others) ``weights``. A failed broadcast (an engine
        died) closes the group, so that no engine waits for the rest, and the gather is
        still run to its end: the other ranks are in it. The driver then replaces the
        engine and forms the group again."""
        stream = iter(weights)
        if self.rank != 0 or self.pg is None:
            for _ in stream:
                pass
            return {"ok": True, "bytes": 0}
        error = ""
        try:
            sent = send_weights(self.pg, stream, self.device,
                                timeout_min_s=self.timeout_min_s)
        except Exception as err:  # outside this block nothing refers to the group
            # Logged as text: a log record holding the exception would hold its frames,
            # so the group, alive.
            error = str(err)[:500] or type(err).__name__
            log.warning("weight broadcast to the rollout engines failed: %s", error)
        if not error:
            return {"ok": True, "bytes": sent}
        abandon(self.pg, self.device)
        self.pg = None
        released()
        for _ in stream:
            pass
        return {"ok": False, "error": error, "bytes": 0}
