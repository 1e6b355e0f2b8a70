"""The GPU catalog: what the planner knows about each accelerator type and its node.

Values are per GPU and per typical node of that GPU. `memory_gib` is the total the
driver reports (nvidia-smi "Total", MiB / 1024), not the marketing GB figure, because
that is what CUDA allocations are measured against. Host RAM and CPUs are those of the
common 8-GPU cloud/DGX node shapes (DGX H100 / p5, DGX A100 / p4d, a2, g6e); a spec can
override host RAM and CPUs per node when its nodes differ (`spec.resources`).

`product_label` is the value of the `nvidia.com/gpu.product` node label published by
NVIDIA GPU feature discovery; the operator selects nodes by it and the testbed's fake
nodes carry exactly these values.
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
CPU_GPU_TYPE = "cpu"


@dataclass(frozen=True)
class GpuType:
    """One accelerator type and the node shape it usually comes in."""

    name: str
    memory_gib: float  # per GPU, as reported by the driver
    product_label: str  # nvidia.com/gpu.product value; "" for the cpu pseudo-type
    host_memory_gib: float  # typical host RAM per node
    cpus: int  # typical allocatable CPUs per node
    gpus_per_node: int  # typical GPUs per node (0 for cpu)
    interconnect: str  # intra-node GPU link
    intra_node_gbps: float  # GB/s per GPU within a node (NVLink or PCIe)
    inter_node_gbps: float  # GB/s per node across nodes (IB/EFA), typical
    bf16_tflops: float  # dense, for rough throughput notes only

    @property
    def is_gpu(self) -> bool:
        return self.gpus_per_node > 0


GPU_CATALOG: dict[str, GpuType] = {
    gpu.name: gpu
    for gpu in (
        GpuType(
            name="H100-80GB",
            memory_gib=79.6,  # 81559 MiB
            product_label="NVIDIA-H100-80GB-HBM3",
            host_memory_gib=2048,
            cpus=192,
            gpus_per_node=8,
            interconnect="NVLink4/NVSwitch",
            intra_node_gbps=900,
            inter_node_gbps=400,
            bf16_tflops=989,
        ),
        GpuType(
            name="H200-141GB",
            memory_gib=140.4,  # 143771 MiB
            product_label="NVIDIA-H200",
            host_memory_gib=2048,
            cpus=192,
            gpus_per_node=8,
            interconnect="NVLink4/NVSwitch",
            intra_node_gbps=900,
            inter_node_gbps=400,
            bf16_tflops=989,
        ),
        GpuType(
            name="A100-40GB",
            memory_gib=40.0,  # 40960 MiB
            product_label="NVIDIA-A100-SXM4-40GB",
            host_memory_gib=1152,
            cpus=96,
            gpus_per_node=8,
            interconnect="NVLink3/NVSwitch",
            intra_node_gbps=600,
            inter_node_gbps=50,
            bf16_tflops=312,
        ),
        GpuType(
            name="A100-80GB",
            memory_gib=80.0,  # 81920 MiB
            product_label="NVIDIA-A100-SXM4-80GB",
            host_memory_gib=1152,
            cpus=96,
            gpus_per_node=8,
            interconnect="NVLink3/NVSwitch",
            intra_node_gbps=600,
            inter_node_gbps=50,
            bf16_tflops=312,
        ),
        GpuType(
            name="L40S-48GB",
            memory_gib=45.0,  # 46068 MiB
            product_label="NVIDIA-L40S",
            host_memory_gib=1536,
            cpus=192,
            gpus_per_node=8,
            interconnect="PCIe Gen4 (no NVLink)",
            intra_node_gbps=32,
            inter_node_gbps=50,
            bf16_tflops=362,
        ),
        GpuType(
            # The tiny CPU job (tests, laptops): ranks are CPU processes using gloo.
            name=CPU_GPU_TYPE,
            memory_gib=0.0,
            product_label="",
            host_memory_gib=16,
            cpus=4,
            gpus_per_node=0,
            interconnect="none",
            intra_node_gbps=0,
            inter_node_gbps=0,
            bf16_tflops=0,
        ),
    )
}

GPU_TYPE_NAMES: tuple[str, ...] = tuple(GPU_CATALOG)


def gpu_type(name: str) -> GpuType:
    """Look a type up by name, with an error that lists the known names."""
    try:
        return GPU_CATALOG[name]
    except KeyError:
        known = ", ".join(GPU_TYPE_NAMES)
        raise KeyError(f"unknown GPU type {name!r}; known types: {known}") from None
