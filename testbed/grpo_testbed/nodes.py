"""Fake nodes that look like real GPU nodes to the scheduler and to KubeRay.

kwok manages every node annotated `kwok.x-k8s.io/node: fake`: it keeps them Ready
and runs their pods in name only. Host RAM and CPU follow the machines of the incidents
in docs/incidents.md (8 x H100 with 2 TiB; 8 x A100-40GB with 760 GiB), which is why
they are set here rather than taken from the catalog's typical node shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_api.catalog import GPU_CATALOG, GPU_PRODUCT_LABEL, GPU_RESOURCE

from .versions import KUBERNETES_VERSION

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
GPU_TAINT_KEY = GPU_RESOURCE  # nvidia.com/gpu=present:NoSchedule, as GPU node pools set it


@dataclass(frozen=True)
class FakeNode:
    name: str
    gpu_type: str | None  # a GPU_CATALOG name, or None for a CPU-only node
    cpus: int
    memory_gib: int
    instance_type: str

    @property
    def gpus(self) -> int:
        return GPU_CATALOG[self.gpu_type].gpus_per_node if self.gpu_type else 0


FAKE_NODES: tuple[FakeNode, ...] = (
    FakeNode("h100-0", "H100-80GB", 192, 2048, "p5.48xlarge"),
    FakeNode("h100-1", "H100-80GB", 192, 2048, "p5.48xlarge"),
    FakeNode("a100-40gb-0", "A100-40GB", 96, 760, "p4d.24xlarge"),
    FakeNode("a100-40gb-1", "A100-40GB", 96, 760, "p4d.24xlarge"),
    FakeNode("cpu-0", None, 32, 128, "m6i.8xlarge"),
)


def node_manifest(node: FakeNode) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": node.instance_type,
        "type": "kwok",
    }
    capacity = {
        "cpu": str(node.cpus),
        "memory": f"{node.memory_gib}Gi",
        "pods": "110",
        "ephemeral-storage": "1Ti",
    }
    spec: dict[str, Any] = {}
    if node.gpu_type:
        gpu = GPU_CATALOG[node.gpu_type]
        labels |= {
            GPU_PRODUCT_LABEL: gpu.product_label,
            "nvidia.com/gpu.count": str(gpu.gpus_per_node),
            "nvidia.com/gpu.memory": str(int(gpu.memory_gib * 1024)),
            "nvidia.com/gpu.present": "true",
        }
        capacity[GPU_RESOURCE] = str(gpu.gpus_per_node)
        spec["taints"] = [{"key": GPU_TAINT_KEY, "value": "present", "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node.name,
            "labels": labels,
            "annotations": {KWOK_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": KUBERNETES_VERSION,
                "kubeProxyVersion": KUBERNETES_VERSION,
            },
        },
    }


def bulk_cpu_nodes(count: int, prefix: str = "bulk") -> list[dict[str, Any]]:
    """Big CPU-only fake nodes for benchmarks, so no pod ever waits for capacity."""
    return [node_manifest(FakeNode(f"{prefix}-{i}", None, 512, 2048, "bench.metal"))
            for i in range(count)]
