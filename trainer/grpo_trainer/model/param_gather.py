"""Full parameters out of FSDP2 shards in buckets: one all-gather per bucket.

Each bucket is packed and gathered on the mesh's device: with ``actor.offload_params`` a
CUDA rank's shards are host memory, and the bucket is copied to the GPU first so NCCL
gathers it (``bucket_device``); gathering on the host would send the whole model over
gloo every step.

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
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DeviceMesh, DTensor, Shard

from grpo_api.contract import WEIGHT_SYNC_BUCKET_BYTES

from ..cluster.devices import staging_device_type

# Bounds one collective's gathered buffer: world x (this rank's padded shards) = the
# bucket's full parameters plus the padding of uneven last shards. The engine copies each
# tensor out before the next bucket is gathered, so this is the extra peak memory, and
# the number of collectives is about (model bytes / DEFAULT_BUCKET_BYTES) at any world
# size (7B in bf16: ~57; each rank contributes 256 MiB / world to each). The planner
# counts these buffers in the rollout stage (planner/budget.py, weight_sync_bytes).
DEFAULT_BUCKET_BYTES = WEIGHT_SYNC_BUCKET_BYTES


@dataclass(frozen=True)
class GatherItem:
    """One parameter as the bucketing sees it."""

    shape: tuple[int, ...]
    mesh: Hashable | None  # its row-sharding mesh; None: not row-sharded, gathered alone
    world: int = 1  # the mesh's size


def _row_sharded_mesh(param: torch.Tensor) -> DeviceMesh | None:
    if not isinstance(param, DTensor) or param.dim() == 0:
        return None
    mesh = param.device_mesh
    if mesh.ndim != 1 or tuple(param.placements) != (Shard(0),):
        return None
    return mesh


def _slot_rows(rows: int, world: int) -> int:
    return math.ceil(rows / world)


def gathered_bytes(shape: tuple[int, ...], world: int, itemsize: int) -> int:
    """What a row-sharded parameter occupies in the gathered buffer: ``world`` equal slots
    of ``ceil(rows / world)`` rows (its full size, plus the padding of the last shards)."""
    rows = shape[0]
    per_row = math.prod(shape[1:])
    return world * _slot_rows(rows, world) * per_row * itemsize


def plan_buckets(
    items: Sequence[GatherItem], itemsize: int, bucket_bytes: int
) -> list[list[int]]:
    """The collectives of one gather, in parameter order: the indices gathered together.

    Consecutive row-sharded parameters on one mesh share a collective while their
    gathered bytes fit ``bucket_bytes`` (one bigger than that goes alone); a parameter
    that is not row-sharded is a collective of its own. Pure: the count of collectives
    can be checked at any world size without ranks.
    """
    buckets: list[list[int]] = []
    size = 0
    open_mesh: Hashable | None = None
    for i, item in enumerate(items):
        if item.mesh is None:
            buckets.append([i])
            open_mesh = None
            continue
        nbytes = gathered_bytes(item.shape, item.world, itemsize)
        if open_mesh is not None and item.mesh == open_mesh and size + nbytes <= bucket_bytes:
            buckets[-1].append(i)
            size += nbytes
        else:
            buckets.append([i])
            open_mesh, size = item.mesh, nbytes
    return buckets


def bucket_device(shard: torch.Tensor, mesh_device_type: str) -> torch.device:
    """Where a bucket is packed and gathered: the shards' device, or, for offloaded shards
    (host) of a CUDA mesh, the rank's current GPU, so NCCL gathers it and not gloo."""
    where = staging_device_type(shard.device.type, mesh_device_type)
    return shard.device if where == shard.device.type else torch.device(where)


def _gather_bucket(
    bucket: list[tuple[str, DTensor]], mesh: DeviceMesh, dtype: torch.dtype
) -> Iterator[tuple[str, torch.Tensor]]:
    world = mesh.size()
    slots = [_slot_rows(p.shape[0], world) * (p.numel() // max(p.shape[0], 1)) for _, p in bucket]
    local = bucket[0][1].to_local()
    flat = torch.zeros(sum(slots), dtype=dtype, device=bucket_device(local, mesh.device_type))
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


def _full_alone(p: torch.Tensor) -> torch.Tensor:
    """A parameter that is not row-sharded, whole; an offloaded DTensor's shard is moved
    to its mesh's device first, so its gather runs there (NCCL) too."""
    if not isinstance(p, DTensor):
        return p
    local = p.to_local()
    where = bucket_device(local, p.device_mesh.device_type)
    if where != local.device:
        p = DTensor.from_local(local.to(where), p.device_mesh, p.placements,
                               shape=p.shape, stride=p.stride())
    return p.full_tensor()


def gather_full_params(
    model: nn.Module,
    dtype: torch.dtype,
    bucket_bytes: int = DEFAULT_BUCKET_BYTES,
    only: Callable[[str], bool] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor in ``dtype``) for every parameter (or those whose name ``only``
    accepts: LoRA adapters), in ``named_parameters`` order.

    A collective: every rank must exhaust the iterator. Parameters that are not
    row-sharded DTensors (plain tensors, other placements) take the per-parameter
    path. The yielded tensors may be views of a shared buffer: copy them.
    """
    itemsize = torch.empty((), dtype=dtype).element_size()
    params = [
        (name, p.detach()) for name, p in model.named_parameters() if only is None or only(name)
    ]
    meshes = [_row_sharded_mesh(p) for _, p in params]
    items = [
        GatherItem(tuple(p.shape), m, m.size() if m is not None else 1)
        for (_, p), m in zip(params, meshes, strict=True)
    ]
    for bucket in plan_buckets(items, itemsize, bucket_bytes):
        mesh = meshes[bucket[0]]
        if mesh is None:
            name, p = params[bucket[0]]
            yield name, _full_alone(p).to(dtype)
            continue
        members = [(params[i][0], cast(DTensor, params[i][1])) for i in bucket]
        yield from _gather_bucket(members, mesh, dtype)
