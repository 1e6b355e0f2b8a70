"""Which device, and so which backend, each hot-path collective of a CUDA rank uses
(pure: CPU tests pin what only a GPU runs). A CUDA rank's group is
``cpu:gloo,cuda:nccl`` (devices.process_group_backend) and torch dispatches a
collective by its tensors' device, so a buffer on the host crosses gloo (TCP).

- The weight sync (param_gather._gather_bucket): with actor.offload_params FSDP2 keeps
  the shards on the host while their mesh is CUDA; the bucket used to be allocated on
  the shard's device, so the whole model crossed gloo every step (14 GB at 7B, 145 GB at
  72B). ``bucket_device`` puts it on the GPU.
- Rank-0 init (modeling.build_sharded): torch's ``set_model_state_dict(...,
  broadcast_from_rank0=True)`` broadcasts on the local tensors' device (torch 2.13
  distributed/checkpoint/state_dict.py:594-612, _state_dict_utils.py:546-550), the host
  when offloaded; ``rank0_init.broadcast_device`` picks the GPU instead.
"""

from __future__ import annotations

import pytest
import torch

from grpo_trainer.cluster.devices import MIXED_BACKEND, collective_backend, process_group_backend
from grpo_trainer.model.param_gather import bucket_device
from grpo_trainer.model.rank0_init import broadcast_device

pytestmark = pytest.mark.unit
CUDA = torch.device("cuda", 3)  # a device spec only: nothing is allocated on it
HOST = torch.device("cpu")


def backend(device: torch.device) -> str:
    return collective_backend(process_group_backend("cuda"), device.type)


def test_a_cuda_ranks_group_takes_nccl_for_gpu_tensors_and_gloo_for_host_ones() -> None:
    assert process_group_backend("cuda") == MIXED_BACKEND
    assert backend(CUDA) == "nccl" and backend(HOST) == "gloo"
    assert collective_backend(process_group_backend("cpu"), "cpu") == "gloo"


def test_the_weight_sync_of_offloaded_shards_gathers_on_the_gpu_over_nccl() -> None:
    where = bucket_device(torch.empty(0), "cuda")  # a host shard of a CUDA mesh
    assert where.type == "cuda" and backend(where) == "nccl"


def test_a_cpu_ranks_sync_stays_on_the_host() -> None:
    assert bucket_device(torch.empty(0), "cpu") == HOST


def test_rank0_init_of_offloaded_params_broadcasts_on_the_gpu_over_nccl() -> None:
    assert broadcast_device(CUDA, HOST) == CUDA and backend(broadcast_device(CUDA, HOST)) == "nccl"
    assert broadcast_device(CUDA, CUDA) == CUDA  # not offloaded: torch's own path, on the GPU
    assert broadcast_device(HOST, HOST) == HOST  # a CPU rank: gloo, nothing else exists
