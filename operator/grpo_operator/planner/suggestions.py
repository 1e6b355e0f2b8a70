"""What an infeasible job could change to fit, ordered by what the change costs the user.

1. a pinned knob's nearest value that fits (pin_fixes.py): the user's own setting moved;
2. unpinning the knobs: the planner chooses them;
3. the host memory the spec states (resources.hostMemory), up to what the catalog says
   its nodes have, and a setting that lowers the host peak (checkpoint.asyncSave);
4. more GPUs per node, then more nodes, then a GPU type with more memory: more hardware;
5. a cheaper training mode (mode_advice.py): bf16, then LoRA, which change the training;
6. a smaller model: another job.
Every line is checked with the planner's own fit test (core passes it in). Pure.
"""

from __future__ import annotations

import math
from dataclasses import replace

from grpo_api.catalog import GPU_CATALOG, GpuType
from grpo_api.job.resources import MemorySpec
from grpo_api.job.spec import GRPOJobSpec
from grpo_api.knobs import PINNABLE
from grpo_api.model.shape import KNOWN_MODELS

from .mode_advice import Fits, mode_suggestions
from .pin_fixes import peaks, pinned_value_fixes
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


def _unpin(geo: Geometry, spec: GRPOJobSpec, pinned: frozenset[str], fits: Fits) -> list[str]:
    if not pinned:
        return []
    auto = spec.model_copy(update={"memory": MemorySpec.model_validate({})})
    if fits(geo, auto, frozenset()) is None:
        return []
    names = ", ".join(f"memory.{PINNABLE[k]}" for k in sorted(pinned))
    return [f"unset {names} (let the planner choose)"]


def _host(geo: Geometry, spec: GRPOJobSpec, pinned: frozenset[str], fits: Fits) -> list[str]:
    """The least resources.hostMemory that fits, when the spec states less than its GPU
    type's nodes have (the catalog's; the spec's own figure when that is larger), and
    checkpoint.asyncSave off when its host staging copy is what does not fit."""
    out = []
    node = GPU_CATALOG[geo.gpu].host_memory_gib if geo.gpu in GPU_CATALOG else 0.0
    now = geo.host_memory_gib
    if spec.resources.host_memory and now < node:
        lo, hi = math.floor(now) + 1, math.floor(node)
        if fits(replace(geo, host_memory_gib=hi), spec, pinned) is not None:
            while lo < hi:  # the least whole GiB that fits: more host never fits less
                mid = (lo + hi) // 2
                if fits(replace(geo, host_memory_gib=mid), spec, pinned) is not None:
                    hi = mid
                else:
                    lo = mid + 1
            more = replace(geo, host_memory_gib=hi)
            st = fits(more, spec, pinned)
            assert st is not None
            out.append(f"resources.hostMemory: {hi}Gi instead of {spec.resources.host_memory} "
                       f"(the least that fits; {geo.gpu} nodes have {node:.0f} GiB; "
                       f"{peaks(more, st)})")
    sync = replace(geo, async_save=False)
    if geo.async_save and (st := fits(sync, spec, pinned)) is not None:
        out.append("checkpoint.asyncSave: false (no host copy of each rank's state to save "
                   f"from; saves pause training instead; {peaks(sync, st)})")
    return out


def _hardware(geo: Geometry, spec: GRPOJobSpec, pinned: frozenset[str],
              fits: Fits) -> list[str]:
    """More GPUs per node, more nodes, a GPU type with more memory per GPU."""
    if not geo.is_gpu:
        return []
    out = []
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
            out.append(f"resources.gpuType: {gpu.name} ({gpu.memory_gib:.0f} GiB per GPU)")
            break
    return out


def _smaller_model(geo: Geometry, spec: GRPOJobSpec, pinned: frozenset[str],
                   fits: Fits) -> list[str]:
    vision = geo.shape.vision_parameters > 0  # a VLM job is offered VLMs, text jobs text
    smaller = sorted(
        (s for s in KNOWN_MODELS.items()
         if s[1].parameters < geo.shape.parameters and (s[1].vision_parameters > 0) == vision),
        key=lambda kv: -kv[1].parameters,
    )
    for name, shape in smaller:
        if fits(replace(geo, shape=shape), spec, pinned):
            return [f"a smaller model: {name} ({shape.parameters / 1e9:.1f}B) fits as is"]
    return []


def ordered_suggestions(geo: Geometry, spec: GRPOJobSpec, pinned: frozenset[str], fits: Fits,
                        max_nodes: int, derived: bool = False) -> list[str]:
    """Every change (of those above) that would fit, the cheapest for the user first."""
    return [
        *pinned_value_fixes(geo, spec, pinned, fits),
        *_unpin(geo, spec, pinned, fits),
        *_host(geo, spec, pinned, fits),
        *_hardware(geo, spec, pinned, fits),
        *mode_suggestions(geo, spec, pinned, fits, max_nodes, derived),
        *_smaller_model(geo, spec, pinned, fits),
    ]
