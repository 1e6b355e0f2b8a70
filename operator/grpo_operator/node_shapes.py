"""The GPU nodes as they are (pure): the planner sizes pods for the allocatable memory and
CPUs of the Nodes that carry a GPU type's product label, not the catalog's typical figures.

The operator lists the schedulable Nodes labelled nvidia.com/gpu.product (node_cache.py,
where its RBAC lets it read Nodes) and takes, per GPU type, the smallest node: a pod
planned for it fits on any of them. The catalog's `host_memory_gib` is RAM, of which the
planner counts 95% as allocatable (budget.SYSTEM_RESERVED_FRACTION); a Node reports its
allocatable itself, so its figure goes in as the RAM whose 95% it is. Where the operator
cannot read Nodes, or none carries a type's label, the catalog's figures stay and the
plan names them as assumed (GpuType.node_source). spec.resources.hostMemory /
cpusPerNode still win over both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

from grpo_api.catalog import GPU_PRODUCT_LABEL, GpuType
from grpo_api.job.base import quantity_gib

from .planner.budget import SYSTEM_RESERVED_FRACTION


@dataclass(frozen=True)
class NodeShape:
    """The schedulable Nodes of one GPU type: how many, and the smallest's allocatable."""

    nodes: int
    allocatable_gib: float
    cpus: int


def _cpus(value: str) -> int:
    """Whole CPUs of a Kubernetes CPU quantity ("190", "191500m")."""
    return math.floor(float(value[:-1]) / 1000) if value.endswith("m") else math.floor(
        float(value))


def node_shapes(nodes: Iterable[Mapping[str, Any]],
                catalog: Mapping[str, GpuType]) -> dict[str, NodeShape]:
    """Per GPU type of `catalog`, its schedulable Nodes' shape (types without one: absent).
    A Node whose allocatable cannot be read is left out."""
    types_by_label: dict[str, list[str]] = {}
    for gpu in catalog.values():
        if gpu.product_label:
            types_by_label.setdefault(gpu.product_label, []).append(gpu.name)
    seen: dict[str, list[tuple[float, int]]] = {}
    for node in nodes:
        if (node.get("spec") or {}).get("unschedulable"):
            continue  # cordoned: no new pod lands there
        label = ((node.get("metadata") or {}).get("labels") or {}).get(GPU_PRODUCT_LABEL)
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        try:
            shape = (quantity_gib(str(allocatable["memory"])), _cpus(str(allocatable["cpu"])))
        except (KeyError, ValueError):
            continue
        for name in types_by_label.get(str(label), []):
            seen.setdefault(name, []).append(shape)
    return {name: NodeShape(len(found), min(m for m, _ in found), min(c for _, c in found))
            for name, found in seen.items()}


def catalog_with_nodes(catalog: Mapping[str, GpuType],
                       shapes: Mapping[str, NodeShape] | None) -> Mapping[str, GpuType]:
    """`catalog` with each GPU type's host memory and CPUs as its Nodes allocate them,
    and where the figures come from (GpuType.node_source). `shapes` None: Nodes were not
    read (the catalog's figures, assumed)."""
    if shapes is None:
        return catalog
    out: dict[str, GpuType] = {}
    for name, gpu in catalog.items():
        shape = shapes.get(name)
        if not gpu.is_gpu:
            out[name] = gpu
        elif shape is None:
            out[name] = replace(gpu, node_source=(
                f"the catalog's figures, assumed: no schedulable Node is labelled "
                f"{GPU_PRODUCT_LABEL}={gpu.product_label}"))
        else:
            out[name] = replace(
                gpu, host_memory_gib=shape.allocatable_gib / (1 - SYSTEM_RESERVED_FRACTION),
                cpus=shape.cpus, node_source=(
                    f"{shape.nodes} Node(s) labelled {GPU_PRODUCT_LABEL}={gpu.product_label}; "
                    f"the smallest allocates {shape.allocatable_gib:.1f} GiB and "
                    f"{shape.cpus} CPUs"))
    return MappingProxyType(out)
