"""The GPU catalog: what the planner knows about each accelerator type and its node.

Values are per GPU and per typical node of that GPU. `memory_gib` is the total the
driver reports (nvidia-smi "Total", MiB / 1024), not the marketing GB figure, because
that is what CUDA allocations are measured against. Host RAM and CPUs are those of the
common 8-GPU cloud/DGX node shapes (DGX H100 / p5, DGX A100 / p4d, a2, g6e); a spec can
override host RAM and CPUs per node when its nodes differ (`spec.resources`).

`product_label` is the value of the `nvidia.com/gpu.product` node label published by
NVIDIA GPU feature discovery; the operator selects nodes by it and the testbed's fake
nodes carry exactly these values.

`fabric` is the RDMA network between nodes that clusters of a type typically have:
InfiniBand for the DGX/HGX shapes (DGX H100/H200/B200 and DGX A100 80GB ship with
ConnectX InfiniBand HCAs, one per GPU); none assumed for A100-40GB (DGX A100 has IB,
AWS's p4d has EFA), the PCIe cards and H20. Clusters differ: the chart's `gpuCatalog`
sets it per type (`fabric: efa` for p5 H100s, `none` for Ethernet-only nodes).

Sources of the newer entries (per-GPU memory as nvidia-smi reports it, node shapes as
the clouds sell them, dense BF16 TFLOPS from NVIDIA's datasheets):
- L4: NVIDIA L4 datasheet (24 GB GDDR6, 121 TFLOPS BF16 dense, PCIe Gen4); nvidia-smi
  23034 MiB (modal-labs/modal-client#2797); node AWS g6.48xlarge (8 x L4, 192 vCPU,
  768 GiB, 100 Gbit/s).
- A10G: AWS's A10 variant; nvidia-smi 23028 MiB (NVIDIA/DCGM#232); BF16 from the NVIDIA
  A10 datasheet (125 TFLOPS dense; NVIDIA publishes no A10G sheet, so this is an upper
  bound); node AWS g5.48xlarge (8 x A10G, 192 vCPU, 768 GiB, 100 Gbit/s).
- H20: NVIDIA H20 product brief (96 GB HBM3, 148 TFLOPS BF16 dense, NVLink 900 GB/s);
  96 GiB less the driver's reserve in H100's proportion (81559 of 81920 MiB) gives
  ~97871 MiB; node as HGX H100 (8 GPUs, 2 TiB, 192 CPUs, 8 x 400 Gbit/s).
- B200: NVIDIA DGX B200 datasheet (8 x B200 with 1,440 GB in all, 2 TB RAM, 2 x 56-core
  Xeon 8570 = 224 threads, NVLink 5 at 1.8 TB/s per GPU, 8 x 400 Gbit/s); nvidia-smi
  183359 MiB (NVIDIA/TensorRT-LLM#10278); BF16 2.25 PFLOPS dense (HGX B200 datasheet,
  36 PFLOPS sparse for 8).
- RTX3060-12GB and RTX5090-32GB: the 12 GB and 32 GB columns of EasyR1's hardware table
  (README, "Hardware Requirements"), as people own them: GeForce cards with bf16 (Ampere,
  Blackwell; V100-32GB has no bf16, which vLLM and the trainer's bf16 compute need).
  nvidia-smi 12288 MiB (RTX 3060, geerlingguy/raspberry-pi-pcie-devices#790) and 32607 MiB
  (RTX 5090, noonghunna/club-3090#1229). BF16 dense with fp32 accumulate, approximate
  (GeForce runs it at half the fp16-accumulate rate). The node shapes are assumptions: a
  one-GPU desktop (64 GiB, 16 CPUs) and a four-GPU workstation (256 GiB, 64 CPUs), PCIe
  only; set `resources.hostMemory` and `cpusPerNode` for yours.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
GPU_RESOURCE = "nvidia.com/gpu"
CPU_GPU_TYPE = "cpu"

# The RDMA fabric between a GPU type's nodes, as its typical clusters have it (`fabric`):
# on-prem DGX/HGX nodes carry InfiniBand HCAs, AWS's p4d/p5 carry EFA. Which fabric a
# cluster really has varies, so the chart's gpuCatalog can set it per type (or "none").
INFINIBAND, EFA = "infiniband", "efa"
FABRICS = (INFINIBAND, EFA)
# How a worker pod asks for a fabric's devices (spec.resources.devices): the extended
# resources their device plugins advertise. InfiniBand/RoCE: the NVIDIA (Mellanox) RDMA
# shared device plugin advertises `rdma/<name>` (e.g. rdma/ib, rdma/rdma_shared_device_a);
# EFA: the AWS EFA device plugin advertises `vpc.amazonaws.com/efa`.
FABRIC_DEVICE_PREFIXES: dict[str, tuple[str, ...]] = {
    INFINIBAND: ("rdma/",),
    EFA: ("vpc.amazonaws.com/efa",),
}


def device_fabric(resource: str) -> str | None:
    """The fabric an extended resource of a worker pod belongs to, if one is known."""
    return next((f for f, prefixes in FABRIC_DEVICE_PREFIXES.items()
                 if resource.startswith(prefixes)), None)


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
    fabric: str | None = None  # RDMA fabric between nodes (FABRICS), None: TCP only
    # Where host_memory_gib and cpus come from, in the plan's words: the catalog's typical
    # node (assumed), or the Nodes the operator read (operator node_shapes.py).
    node_source: str = "the catalog's figures, assumed (Nodes not read)"

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
            fabric=INFINIBAND,
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
            fabric=INFINIBAND,
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
            fabric=INFINIBAND,
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
            name="L4-24GB",
            memory_gib=22.5,  # 23034 MiB
            product_label="NVIDIA-L4",
            host_memory_gib=768,
            cpus=192,
            gpus_per_node=8,
            interconnect="PCIe Gen4 (no NVLink)",
            intra_node_gbps=32,
            inter_node_gbps=12.5,
            bf16_tflops=121,
        ),
        GpuType(
            name="A10G-24GB",
            memory_gib=22.5,  # 23028 MiB
            product_label="NVIDIA-A10G",
            host_memory_gib=768,
            cpus=192,
            gpus_per_node=8,
            interconnect="PCIe Gen4 (no NVLink)",
            intra_node_gbps=32,
            inter_node_gbps=12.5,
            bf16_tflops=125,
        ),
        GpuType(
            name="H20-96GB",
            memory_gib=95.5,  # ~97871 MiB (see the module docstring)
            product_label="NVIDIA-H20",
            host_memory_gib=2048,
            cpus=192,
            gpus_per_node=8,
            interconnect="NVLink4/NVSwitch",
            intra_node_gbps=900,
            inter_node_gbps=400,
            bf16_tflops=148,
        ),
        GpuType(
            name="B200-180GB",
            memory_gib=179.0,  # 183359 MiB
            product_label="NVIDIA-B200",
            host_memory_gib=2048,
            cpus=224,
            gpus_per_node=8,
            interconnect="NVLink5/NVSwitch",
            intra_node_gbps=1800,
            inter_node_gbps=400,
            bf16_tflops=2250,
            fabric=INFINIBAND,
        ),
        GpuType(
            name="RTX3060-12GB",
            memory_gib=12.0,  # 12288 MiB
            product_label="NVIDIA-GeForce-RTX-3060",
            host_memory_gib=64,
            cpus=16,
            gpus_per_node=1,
            interconnect="PCIe Gen4 (no NVLink)",
            intra_node_gbps=32,
            inter_node_gbps=1.25,
            bf16_tflops=25,
        ),
        GpuType(
            name="RTX5090-32GB",
            memory_gib=31.8,  # 32607 MiB
            product_label="NVIDIA-GeForce-RTX-5090",
            host_memory_gib=256,
            cpus=64,
            gpus_per_node=4,
            interconnect="PCIe Gen5 (no NVLink)",
            intra_node_gbps=64,
            inter_node_gbps=12.5,
            bf16_tflops=105,
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
# What a GPU type's name may look like (CRD pattern, chart overrides): a label-like token.
GPU_NAME_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$"


class UnknownGpuType(ValueError):
    """A GPU type the catalog in use does not have; the message lists those it has."""


def gpu_type(name: str, catalog: Mapping[str, GpuType] = GPU_CATALOG) -> GpuType:
    """Look a type up by name, with an error that lists the known names."""
    try:
        return catalog[name]
    except KeyError:
        known = ", ".join(catalog)
        raise UnknownGpuType(
            f"unknown GPU type {name!r}; known types: {known} (the chart's gpuCatalog "
            "value adds types)"
        ) from None
