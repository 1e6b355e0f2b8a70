"""Kueue ResourceFlavors for the GPU catalog (pure): one per GPU type, selecting its
nodes by the product label the operator already puts in the worker pods' nodeSelector,
plus one for CPU and memory. A ClusterQueue then sets quota per flavor, so a job for one
GPU type never takes another type's quota (docs/kueue.md)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from grpo_api.catalog import GPU_PRODUCT_LABEL, GpuType

KUEUE_API_VERSION = "kueue.x-k8s.io/v1beta2"
# CPU and memory of every Ray pod (the head has no GPU): no node labels, any node.
CPU_FLAVOR = "default-flavor"


def flavor_name(gpu: GpuType) -> str:
    """A DNS-1123 name for the GPU type's flavor, e.g. H100-80GB -> h100-80gb."""
    return re.sub(r"[^a-z0-9-]+", "-", gpu.name.lower()).strip("-")


def resource_flavors(catalog: Mapping[str, GpuType]) -> list[dict[str, Any]]:
    flavors = [{"apiVersion": KUEUE_API_VERSION, "kind": "ResourceFlavor",
                "metadata": {"name": CPU_FLAVOR}}]
    for gpu in sorted(catalog.values(), key=lambda g: g.name):
        if gpu.is_gpu:
            flavors.append({
                "apiVersion": KUEUE_API_VERSION, "kind": "ResourceFlavor",
                "metadata": {"name": flavor_name(gpu), "labels": {"grpo.dev/gpu": gpu.name}},
                "spec": {"nodeLabels": {GPU_PRODUCT_LABEL: gpu.product_label}},
            })
    return flavors
