"""GRPOJob.spec.resources and .memory: where the job runs and the memory knobs the
planner resolves (unset = auto; see spec.py)."""

from __future__ import annotations

import re
from typing import Annotated, Self

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from ..catalog import GPU_NAME_PATTERN, GPU_RESOURCE, GPU_TYPE_NAMES
from .base import QUANTITY_PATTERN, ApiModel, cel_rule

# Any name in the operator's effective catalog (built-in + the chart's gpuCatalog): the
# schema checks the form, the webhook and the planner the name (with the known ones listed).
GpuName = Annotated[str, Field(pattern=GPU_NAME_PATTERN)]

# An extended resource name (Kubernetes `IsExtendedResourceName`): a qualified name whose
# prefix, a DNS-1123 subdomain, is required and outside kubernetes.io; `requests.` is
# reserved for quota. The device plugin that advertises it chose the name.
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_EXTENDED_RESOURCE = re.compile(
    rf"^(?P<prefix>{_DNS_SUBDOMAIN})/[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$"
)


def extended_resource_problem(name: str) -> str | None:
    """Why `name` cannot be a device resource of a worker pod, or None."""
    m = _EXTENDED_RESOURCE.match(name)
    if m is None or len(m["prefix"]) > 253:
        return (
            f"{name!r} is not an extended resource name: <domain>/<name> as the device "
            "plugin advertises it, e.g. rdma/ib or vpc.amazonaws.com/efa"
        )
    prefix = m["prefix"]
    if prefix == "kubernetes.io" or prefix.endswith(".kubernetes.io") or name.startswith(
        "requests."
    ):
        return f"{name!r}: the kubernetes.io domain and requests. are reserved by Kubernetes"
    if name == GPU_RESOURCE:
        return f"{name!r}: GPUs come from resources.gpuType and resources.gpusPerNode"
    return None


def _advertisable(devices: dict[str, int]) -> dict[str, int]:
    problems = [p for p in map(extended_resource_problem, devices) if p]
    if problems:
        raise ValueError("; ".join(problems))
    return devices


# Extra device resources of a worker pod, name -> count (spec.resources.devices, and the
# platform's jobDefaults.devices): each name one a device plugin can advertise.
DeviceCounts = Annotated[dict[str, Annotated[int, Field(ge=1, le=1024)]],
                         AfterValidator(_advertisable)]


class ResourcesSpec(ApiModel):
    """Where the job runs. Unset counts are derived by the planner from the model size."""

    model_config = ConfigDict(
        json_schema_extra={
            # gpuType is required, by one of its two names (renames.py): the rule says so.
            "required": [],
            "x-kubernetes-validations": [
                cel_rule(
                    "has(self.gpuType) || has(self.gpu)",
                    "resources.gpuType is required: the GPU type of the worker nodes (e.g. "
                    "H100-80GB), or cpu",
                    ".gpuType",
                ),
                cel_rule(
                    "(has(self.gpuType) ? self.gpuType : self.gpu) == 'cpu' "
                    "|| !has(self.nodes) || self.nodes >= 1",
                    "resources.nodes must be at least 1 for a GPU type (0 only for cpu)",
                    ".nodes",
                ),
            ]
        }
    )

    gpu_type: GpuName = Field(
        description=(
            "The GPU type of the worker nodes (the count is gpusPerNode): a name in the "
            f"operator's catalog, or cpu for a tiny CPU-only job (gloo). Built in: "
            f"{', '.join(GPU_TYPE_NAMES)}; the chart's gpuCatalog value adds types. An "
            "unknown name is refused with the known ones listed."
        )
    )
    old_gpu: GpuName | None = Field(
        None, alias="gpu", description="Deprecated: the old name of gpuType, where its value "
        "moves (admission warns).")
    nodes: int | None = Field(
        None,
        ge=0,
        le=512,
        description=(
            "Worker pods, one per node. Unset: the fewest that fit. 0 (cpu only): the "
            "head pod runs the ranks itself."
        ),
    )
    gpus_per_node: int | None = Field(
        None,
        ge=1,
        le=16,
        description=(
            "GPUs per worker (CPU ranks for cpu). Unset: the catalog's node shape. At most "
            "the catalog's GPUs per node for the type (checked at apply); fewer lets jobs "
            "share a node: the worker asks for that share of its CPUs and memory."
        ),
    )
    host_memory: str | None = Field(
        None,
        pattern=QUANTITY_PATTERN,
        description="Host RAM per node (e.g. 760Gi). Unset: the allocatable memory of the "
        "smallest Node labelled with the GPU type's product, where the operator may read "
        "Nodes, else the catalog's figure (status.plan.nodeSource says which).",
    )
    cpus_per_node: int | None = Field(
        None, ge=1, le=1024, description="Allocatable CPUs per node. Unset: as hostMemory, "
        "the smallest such Node's, else the catalog's."
    )
    devices: DeviceCounts | None = Field(
        None,
        description=(
            "Extra device resources per worker pod, name -> count, requested and limited "
            "on its Ray container: the fast network between nodes, e.g. {rdma/ib: 1} "
            "(InfiniBand via the RDMA device plugin) or {vpc.amazonaws.com/efa: 32} (AWS "
            "EFA). For rdma/* and vpc.amazonaws.com/efa the planner adds the NCCL/libfabric "
            "env and the IPC_LOCK capability RDMA needs."
        ),
    )

    @model_validator(mode="after")
    def _nodes_for_gpu(self) -> Self:
        if self.gpu_type != "cpu" and self.nodes == 0:
            raise ValueError("nodes: must be at least 1 for a GPU type (0 only for cpu)")
        if self.devices and self.gpu_type == "cpu" and not self.nodes:
            raise ValueError(
                "devices: go on worker pods, and this cpu job has none (its head runs the "
                "ranks); set resources.nodes >= 1 or leave devices out"
            )
        return self


class MemorySpec(ApiModel):
    """Memory knobs. Each one left unset is chosen by the planner (auto); see status.plan."""

    rank0_init: bool | None = Field(
        None,
        description=(
            "Auto when unset. true: only rank 0 reads the checkpoint, others build on "
            "the meta device and receive shards (bounded host RAM at load)."
        ),
    )
    offload_params: bool | None = Field(
        None,
        description="Auto when unset. true: FSDP parameters live in host RAM between uses.",
    )
    offload_optimizer: bool | None = Field(
        None, description="Auto when unset. true: Adam state lives in host RAM."
    )
    gradient_checkpointing: bool | None = Field(
        None, description="Auto when unset. true: recompute activations in backward."
    )
    rollout_gpu_memory_utilization: float | None = Field(
        None,
        ge=0.1,
        le=0.95,
        description="Auto when unset. Fraction of GPU memory vLLM may take while rolling out.",
    )
    micro_batch_size: int | None = Field(
        None, ge=1, le=1024,
        description="Auto when unset. Per-GPU micro-batch for the update, in samples: setting "
        "it (and not microBatchTokens) makes the update cut micro-batches by samples.",
    )
    micro_batch_tokens: int | None = Field(
        None, ge=1, le=16_777_216,
        description="Auto when unset. Per-GPU micro-batch for the update, in tokens of its "
        "shared-prefix layout (rows x the widest row, padding included): samples fill "
        "micro-batches up to it. At least maxPromptLength + maxResponseLength.",
    )
    ray_object_store_memory: str | None = Field(
        None,
        pattern=QUANTITY_PATTERN,
        description="Auto when unset. Ray object store per node (Ray's own default: 30% of RAM).",
    )

    @model_validator(mode="after")
    def _one_micro_batch_unit(self) -> Self:
        if self.micro_batch_tokens is not None and self.micro_batch_size is not None:
            raise ValueError(
                "microBatchTokens and microBatchSize: set one (tokens, or samples per "
                "micro-batch) or neither (the planner chooses tokens)"
            )
        return self
