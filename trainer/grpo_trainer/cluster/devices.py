"""Where a rank computes and how it reaches its peers: its device type, the process
group's backend and its collective timeout.

The decisions are pure functions of the config and of what torch reports (CPU tests pin
the CUDA branches, which no CPU test can run); ``probe_cuda`` and ``checkpoint_bytes``
are the thin edges that read torch and the model directory.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path

from grpo_api.trainer_config import ResourcesConfig

from ..config_error import ConfigError

# CUDA ranks: NCCL for CUDA tensors and gloo for CPU tensors, in one group. With
# actor.offload_params the FSDP shards and gradients live on the host, so the weight
# sync's all-gather (param_gather.py) and clip_grad_norm_'s all-reduce send CPU tensors,
# which an NCCL-only group refuses ("No backend type associated with device type cpu").
MIXED_BACKEND = "cpu:gloo,cuda:nccl"

# The oldest NVIDIA driver for each CUDA major version a torch wheel is built for
# (NVIDIA's CUDA release notes: 13.0 GA needs 580.65.06; 12.x runs on 525.60.13 and newer).
MIN_DRIVER = {"12": "525.60.13", "13": "580.65.06"}

# Rank 0 reads the whole checkpoint (rank-0 init) while every other rank waits in its
# first collective; a slow shared volume (a network file system at its baseline rate)
# reads about this fast. The floor is torch's own default for gloo; NCCL's is 10 min.
COLLECTIVE_TIMEOUT_FLOOR_S = 1800.0
RANK0_READ_BYTES_PER_S = 64 * 2**20
RANK0_CONVERT_MARGIN_S = 600.0


@dataclass(frozen=True)
class CudaProbe:
    """What torch says about CUDA in this process."""

    available: bool
    torch_cuda: str | None  # torch.version.cuda: the CUDA this wheel is built for
    problem: str  # torch's reason for no CUDA (torch.cuda.init()'s error), "" when fine
    visible_devices: str | None  # CUDA_VISIBLE_DEVICES


def probe_cuda() -> CudaProbe:
    import torch

    problem = ""
    available = torch.cuda.is_available()
    if not available:
        try:
            torch.cuda.init()
        except Exception as err:  # its text says why (no driver, driver too old, ...)
            problem = str(err).strip()
    return CudaProbe(available, torch.version.cuda, problem, os.environ.get("CUDA_VISIBLE_DEVICES"))


def rank_device_type(res: ResourcesConfig, probe: CudaProbe | None) -> str:
    """The rank's device type, "cuda" or "cpu". A rank given GPUs that finds no CUDA
    fails (exit 2) instead of training on the CPU over gloo; only ``resources.fake_gpus``
    (a test cluster whose GPUs are placement tokens) runs such ranks on the CPU."""
    if not res.trains_on_cuda:
        return "cpu"
    if probe is not None and probe.available:
        return "cuda"
    raise ConfigError("resources.gpus_per_worker", no_cuda_message(res, probe))


def no_cuda_message(res: ResourcesConfig, probe: CudaProbe | None) -> str:
    probe = probe or CudaProbe(False, None, "", None)
    why = probe.problem or "torch.cuda.is_available() is False"
    if probe.torch_cuda is None:
        need = "this torch is a CPU build: run the GPU trainer image"
    else:
        driver = MIN_DRIVER.get(probe.torch_cuda.split(".")[0])
        need = f"this torch is built for CUDA {probe.torch_cuda}, which needs " + (
            f"NVIDIA driver {driver} or newer" if driver else "a driver that supports it"
        )
        need += " on the node, exposed by the NVIDIA container runtime"
    return (
        f"{res.gpus_per_worker:g} GPU(s) per rank, but this rank finds no usable CUDA device "
        f"({why}; CUDA_VISIBLE_DEVICES={probe.visible_devices!r}): {need}. A GPU rank "
        "never falls back to training on the CPU"
    )


def process_group_backend(device_type: str) -> str:
    """The trainer's process-group backend: gloo on CPU ranks, NCCL + gloo on CUDA ranks."""
    return MIXED_BACKEND if device_type == "cuda" else "gloo"


def weight_sync_backend(trainer_device_type: str, engine_device_type: str) -> str:
    """The backend of the disaggregated weight sync's group (rank 0 and every rollout
    engine, rollout/weight_bus.py): NCCL when both sides hold their weights on CUDA,
    else gloo, which moves host tensors (a CPU side, or test clusters' fake GPUs)."""
    return "nccl" if trainer_device_type == engine_device_type == "cuda" else "gloo"


def collective_backend(group_backend: str, tensor_device_type: str) -> str:
    """The backend a collective of the group takes for tensors on ``tensor_device_type``
    (torch dispatches a mixed group's collective by its tensors' device): NCCL for
    CUDA tensors, gloo for host tensors of a CUDA rank."""
    pairs = dict(p.split(":", 1) for p in group_backend.split(",") if ":" in p)
    return pairs.get(tensor_device_type, group_backend if not pairs else "none")


def staging_device_type(shard_device_type: str, mesh_device_type: str) -> str:
    """Where a collective over parameter shards puts its buffer: the mesh's device.

    With ``actor.offload_params`` FSDP2 keeps a CUDA rank's shards on the host while the
    DTensors' mesh stays CUDA; a buffer on the shard's device would send the whole model
    over gloo (TCP) every weight sync. Each bucket is copied to the GPU instead and
    gathered over NCCL, as verl's FSDP sync does; the bucket bounds that copy."""
    if shard_device_type == "cpu" and mesh_device_type not in ("cpu", "meta"):
        return mesh_device_type
    return shard_device_type


def collective_timeout_s(checkpoint_bytes: int, configured: float | None) -> float:
    """How long a rank waits in one collective before it fails (init_process_group's
    ``timeout``): ``resources.collective_timeout_s`` when set, else long enough for rank 0
    to read and convert the checkpoint while the others wait (72B in bf16: ~46 min), and
    never under 30 min. A dead peer is noticed sooner anyway (Ray reports it)."""
    if configured is not None:
        return configured
    load = RANK0_CONVERT_MARGIN_S + checkpoint_bytes / RANK0_READ_BYTES_PER_S
    return max(COLLECTIVE_TIMEOUT_FLOOR_S, load)


def job_collective_timeout_s(model_path: str, configured: float | None) -> float:
    """``collective_timeout_s`` for this job's model (its weight files' size): the ranks'
    groups and the disaggregated weight group wait as long."""
    return collective_timeout_s(checkpoint_bytes(model_path), configured)


def checkpoint_bytes(model_path: str) -> int:
    """Bytes of the weight files in a local model directory (0 for anything else)."""
    root = Path(model_path)
    if not root.is_dir():
        return 0
    files = [*root.glob("*.safetensors"), *root.glob("*.bin")]
    return sum(f.stat().st_size for f in files if f.is_file())


def free_port() -> int:
    """A TCP port free on this host now: the process group's rendezvous port."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])
