"""What an infeasible job could change to fit: the planner's suggestions besides
another training mode (mode_advice.py). Pure; core passes its fit test in."""

from __future__ import annotations

from dataclasses import replace

from grpo_api.catalog import GPU_CATALOG, GpuType
from grpo_api.job.resources import MemorySpec
from grpo_api.job.spec import GRPOJobSpec
from grpo_api.knobs import PINNABLE

from .mode_advice import Fits
from .model_shape import KNOWN_MODELS
from .types import Geometry


def on_type(geo: Geometry, gpu: GpuType, spec: GRPOJobSpec) -> Geometry:
    """The same job on another GPU type's nodes: their memory, GPUs, host RAM and CPUs
    (those the spec sets for its nodes stay)."""
    r = spec.resources
    return replace(
        geo, gpu=gpu.name, gpu_memory_gib=gpu.memory_gib, node_gpus=gpu.gpus_per_node,
        product_label=gpu.product_label, fabric=gpu.fabric,
        host_memory_gib=geo.host_memory_gib if r.host_memory else gpu.host_memory_gib,
        cpus_per_node=r.cpus_per_node or gpu.cpus,
    )


def change_suggestions(geo: Geometry, spec: GRPOJobSpec, pinned: frozenset[str],
                       fits: Fits) -> list[str]:
    """The smallest changes of the spec that would fit (core passes its fit test in):
    unpin the memory knobs, more GPUs per node, more nodes, a larger GPU type, a
    smaller model of the same kind."""
    out = []
    if pinned:
        auto = spec.model_copy(update={"memory": MemorySpec.model_validate({})})
        if fits(geo, auto, frozenset()):
            names = ", ".join(f"memory.{PINNABLE[k]}" for k in sorted(pinned))
            out.append(f"unset {names} (let the planner choose)")
    if geo.is_gpu:
        gpn, nodes = geo.gpus_per_node, max(1, geo.nodes)
        for g in range(gpn + 1, geo.node_gpus + 1):
            if fits(replace(geo, gpus_per_node=g), spec, pinned):
                out.append(f"resources.gpusPerNode: {g} ({nodes * g} GPUs)")
                break
        for n in range(nodes + 1, min(max(4 * nodes, 16), 512) + 1):
            if fits(replace(geo, nodes=n), spec, pinned):
                out.append(f"resources.nodes: {n} ({n * gpn} GPUs)")
                break
        for gpu in sorted(GPU_CATALOG.values(), key=lambda g: g.memory_gib):
            if (gpu.memory_gib > geo.gpu_memory_gib and gpu.gpus_per_node >= gpn
                    and fits(on_type(geo, gpu, spec), spec, pinned)):
                out.append(f"resources.gpu: {gpu.name} ({gpu.memory_gib:.0f} GiB per GPU)")
                break
    vision = geo.shape.vision_parameters > 0  # a VLM job is offered VLMs, text jobs text
    smaller = sorted(
        (s for s in KNOWN_MODELS.items()
         if s[1].parameters < geo.shape.parameters and (s[1].vision_parameters > 0) == vision),
        key=lambda kv: -kv[1].parameters,
    )
    for name, shape in smaller:
        if fits(replace(geo, shape=shape), spec, pinned):
            out.append(f"a smaller model: {name} ({shape.parameters / 1e9:.1f}B) fits as is")
            break
    return out
