"""Rank-0 init of offloaded parameters over the rank's device (NCCL), not the host's gloo.

``set_model_state_dict(..., broadcast_from_rank0=True)`` broadcasts on the device of the
local state dict (torch 2.13, ``distributed/checkpoint/state_dict.py`` lines 594-612 take
the one device of the local tensors; ``_state_dict_utils._broadcast_tensors``, lines
546-550, keeps it when the group has a backend for it). With ``actor.offload_params``
FSDP2 keeps the shards on the host, so every tensor of the model crossed gloo, over TCP
to every rank: 145 GB for a 72B model in bf16. Here each tensor is broadcast from rank
0 on the rank's compute device, one tensor at a time (the largest tensor is the extra
GPU memory, the GPU is otherwise empty while the model loads), and each rank copies its
own rows into its host shard.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ..cluster.devices import staging_device_type


def broadcast_device(device: torch.device, home: torch.device) -> torch.device:
    """Where rank-0 init broadcasts: the rank's compute device, wherever the parameters
    live (``home``: the host with ``actor.offload_params`` on a GPU rank)."""
    where = staging_device_type(home.type, device.type)
    return device if where == device.type else home


def load_from_rank0(model: nn.Module, full_sd: dict[str, torch.Tensor],
                    device: torch.device) -> None:
    """Every rank's shard of rank 0's ``full_sd`` (empty on the other ranks), broadcast
    tensor by tensor on ``device``. A collective: every rank calls it, in the same order
    (the model's state-dict order, the same on every rank)."""
    rank = dist.get_rank()
    with torch.no_grad():
        for name, local in model.state_dict().items():
            if rank == 0:
                full = full_sd[name].to(device=device, dtype=local.dtype)
            else:
                full = torch.empty(local.shape, dtype=local.dtype, device=device)
            dist.broadcast(full, src=0)
            if isinstance(local, DTensor):
                # This rank's rows as FSDP2 cuts them (torch.chunk's), without a scatter.
                mine = distribute_tensor(full, local.device_mesh, local.placements,
                                         src_data_rank=None).to_local()
                local.to_local().copy_(mine)
            else:
                local.copy_(full)
            del full
