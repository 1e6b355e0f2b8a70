"""Full parameters out of FSDP2 shards in buckets: one all-gather per bucket.

``modeling.stream_full_params`` gathers one parameter per collective; a model has
hundreds of parameters, and on gloo (CPU) each collective costs about a millisecond
of latency before any bytes move. Here each rank packs its row shards of many
parameters into one flat buffer, converted to the engine's dtype first (half the
bytes for bf16), and the ranks all-gather that buffer once. FSDP2 shards dim 0 like
``torch.chunk``: every rank holds ``ceil(rows / world)`` rows but the last ones,
which may hold fewer or none, so each parameter gets an equal slot on every rank
and the gathered slots are concatenated and trimmed.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DeviceMesh, DTensor, Shard

# Bounds the gathered buffer (world x bucket); the engine copies each tensor out
# before the next bucket is gathered, so this is the extra peak memory.
DEFAULT_BUCKET_BYTES = 256 * 1024 * 1024


def _row_sharded_mesh(param: torch.Tensor) -> DeviceMesh | None:
    if not isinstance(param, DTensor) or param.dim() == 0:
        return None
    mesh = param.device_mesh
    if mesh.ndim != 1 or tuple(param.placements) != (Shard(0),):
        return None
    return mesh


def _slot_rows(rows: int, world: int) -> int:
    return math.ceil(rows / world)


def _gather_bucket(
    bucket: list[tuple[str, DTensor]], mesh: DeviceMesh, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    world = mesh.size()
    slots = [_slot_rows(p.shape[0], world) * (p.numel() // max(p.shape[0], 1)) for _, p in bucket]
    local = bucket[0][1].to_local()
    flat = torch.zeros(sum(slots), dtype=dtype, device=local.device)
    offset = 0
    for (_, param), slot in zip(bucket, slots, strict=True):
        shard = param.to_local().reshape(-1)
        flat[offset : offset + shard.numel()].copy_(shard)
        offset += slot
    gathered = torch.empty(world * flat.numel(), dtype=dtype, device=flat.device)
    dist.all_gather_into_tensor(gathered, flat, group=mesh.get_group())
    by_rank = gathered.view(world, flat.numel())
    offset = 0
    for (name, param), slot in zip(bucket, slots, strict=True):
        rows = _slot_rows(param.shape[0], world)
        full = by_rank[:, offset : offset + slot].reshape(world * rows, *param.shape[1:])
        yield name, full[: param.shape[0]]
        offset += slot


def gather_full_params(
    model: nn.Module, dtype: torch.dtype, bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor in ``dtype``) for every parameter, in ``named_parameters`` order.

    A collective: every rank must exhaust the iterator. Parameters that are not
    row-sharded DTensors (plain tensors, other placements) take the per-parameter
    path. The yielded tensors may be views of a shared buffer: copy them.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    bucket: list[tuple[str, DTensor]] = []
    bucket_mesh: DeviceMesh | None = None
    bucket_size = 0
    for name, param in model.named_parameters():
        p = param.detach()
        mesh = _row_sharded_mesh(p)
        gathered_bytes = p.numel() * itemsize * (mesh.size() if mesh is not None else 1)
        full_bucket = bucket and (
            mesh != bucket_mesh or bucket_size + gathered_bytes > bucket_bytes
        )
        if full_bucket and bucket_mesh is not None:
            yield from _gather_bucket(bucket, bucket_mesh, dtype)
            bucket, bucket_size = [], 0
        if mesh is None:
            full = p.full_tensor() if isinstance(p, DTensor) else p
            yield name, full.to(dtype)
            continue
        assert isinstance(p, DTensor)
        bucket.append((name, p))
        bucket_mesh = mesh
        bucket_size += gathered_bytes
    if bucket and bucket_mesh is not None:
        yield from _gather_bucket(bucket, bucket_mesh, dtype)
