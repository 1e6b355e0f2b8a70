"""A rank's device, process-group backend and collective timeout (grpo_trainer.cluster.devices):
the CUDA decisions, which no CPU test can run, pinned on their inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.distributed import Backend
from torch.distributed.constants import default_pg_nccl_timeout
from torch.distributed.distributed_c10d import BackendConfig

from grpo_api.trainer_config import ResourcesConfig
from grpo_trainer.cluster.devices import (
    CudaProbe,
    checkpoint_bytes,
    collective_timeout_s,
    process_group_backend,
    rank_device_type,
)
from grpo_trainer.config_error import ConfigError

pytestmark = pytest.mark.unit

GPU = ResourcesConfig(num_workers=8, gpus_per_worker=1)
NO_DRIVER = CudaProbe(
    available=False,
    torch_cuda="13.0",
    problem="The NVIDIA driver on your system is too old (found version 12040).",
    visible_devices="3",
)


def test_a_gpu_rank_without_cuda_fails_naming_the_driver_it_needs() -> None:
    """A node whose driver is too old for the image's CUDA must not train on the CPU
    over gloo (the old silent fallback): exit 2, saying what torch saw and what it needs."""
    with pytest.raises(ConfigError) as err:
        rank_device_type(GPU, NO_DRIVER)
    assert err.value.field == "resources.gpus_per_worker"
    text = err.value.message
    assert "too old (found version 12040)" in text and "CUDA_VISIBLE_DEVICES='3'" in text
    assert "CUDA 13.0" in text and "580.65.06" in text
    cpu_build = CudaProbe(False, None, "Torch not compiled with CUDA enabled", None)
    with pytest.raises(ConfigError, match="CPU build"):
        rank_device_type(GPU, cpu_build)


def test_ranks_compute_where_their_resources_say() -> None:
    assert rank_device_type(GPU, CudaProbe(True, "13.0", "", "0")) == "cuda"
    assert rank_device_type(ResourcesConfig(num_workers=2), None) == "cpu"
    # A test cluster's fake GPUs, explicitly: placement tokens, the ranks on the CPU.
    fake = ResourcesConfig(num_workers=2, gpus_per_worker=1, fake_gpus=True)
    assert rank_device_type(fake, NO_DRIVER) == "cpu"


def test_cuda_ranks_have_a_cpu_backend_for_offloaded_tensors() -> None:
    """With actor.offload_params the shards and gradients are CPU tensors: the weight
    sync's all-gather and clip_grad_norm_'s all-reduce need a CPU backend in the group
    (an NCCL-only group raises "No backend type associated with device type cpu")."""
    backends = BackendConfig(Backend(process_group_backend("cuda"))).get_device_backend_map()
    assert backends == {"cpu": "gloo", "cuda": "nccl"}
    assert process_group_backend("cpu") == "gloo"


def test_collective_timeout_outlasts_rank_0_loading_the_checkpoint() -> None:
    """While rank 0 reads and converts the checkpoint, the others wait in a collective:
    NCCL's default (10 min) is shorter than a 72B load from a slow volume."""
    seventy_two_b = 145 * 10**9  # Qwen2.5-VL-72B's safetensors, bf16
    long = collective_timeout_s(seventy_two_b, None)
    assert long > 40 * 60 and long > 4 * default_pg_nccl_timeout.total_seconds()
    assert collective_timeout_s(16 * 10**9, None) == 30 * 60  # 7B: the floor
    assert collective_timeout_s(0, None) == 30 * 60
    assert collective_timeout_s(seventy_two_b, 7200.0) == 7200.0  # the config wins


def test_checkpoint_bytes_counts_the_weight_files(tmp_path: Path) -> None:
    (tmp_path / "model-00001-of-00002.safetensors").write_bytes(b"x" * 1000)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"x" * 24)
    (tmp_path / "pytorch_model.bin").write_bytes(b"x" * 7)
    (tmp_path / "config.json").write_text("{}")
    assert checkpoint_bytes(str(tmp_path)) == 1031
    assert checkpoint_bytes("Qwen/Qwen2.5-VL-7B-Instruct") == 0
