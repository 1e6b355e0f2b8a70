"""The torch side of ``compat.plan_load``: what DCP reads into, and the conversions after.

DCP reads into a flat dict of DCP's own flattened keys: this run's tensors (read in
place, converted by DCP's copy when the dtypes differ), minus the entries this run keeps
as it built them, plus temporaries where a value must be computed from what was saved:
an fp32 master (mixed -> bf16: weight and Kahan compensation are derived from it) or a
saved compensation (bf16 -> mixed: added to the weight). The temporaries are DTensors
shaped like the parameter's shard, where the parameter lives: one fp32 shard copy at
most, 4 bytes a parameter, 12 with the bf16 state (weight, two moments, compensation),
under the 16 a mixed attempt holds while DCP's ``get_state_dict`` creates its optimizer
state (fp32 weight, zeroed gradient, two moments). ``finish`` returns the nested state for
``set_state_dict``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.checkpoint._nested_dict import flatten_state_dict, unflatten_state_dict
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

from ..optim import local_shard
from .compat import COMPENSATION, MODEL, STATE, Entry, LoadPlan, plan_load


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def saved_entries(metadata: Metadata) -> dict[str, Entry]:
    """What a checkpoint holds, from its DCP metadata (no tensor data read)."""
    return {
        key: Entry(_name(md.properties.dtype), tuple(md.size))
        if isinstance(md, TensorStorageMetadata)
        else Entry(None)
        for key, md in metadata.state_dict_metadata.items()
    }


def own_entries(flat: Mapping[str, Any]) -> dict[str, Entry]:
    """What this run's flattened state asks for (a DTensor's shape is the global one)."""
    return {
        key: Entry(_name(v.dtype), tuple(v.shape)) if isinstance(v, torch.Tensor) else Entry(None)
        for key, v in flat.items()
    }


@dataclass
class CrossLoad:
    """One load: the plan, this run's flattened state and what DCP reads into."""

    plan: LoadPlan
    flat: dict[str, Any]
    mappings: dict[str, Any]
    targets: dict[str, Any] = field(default_factory=dict)
    masters: dict[str, torch.Tensor] = field(default_factory=dict)  # to_kahan temporaries
    compensations: dict[str, torch.Tensor] = field(default_factory=dict)  # from_kahan


def _compensation(param: str) -> str:
    return f"{STATE}{param}.{COMPENSATION}"


def prepare(state: dict[str, Any], saved: Mapping[str, Entry]) -> CrossLoad:
    """The plan for loading a checkpoint holding ``saved`` into ``state`` ({"model": ...,
    "optim": ...} from ``get_state_dict``) and, unless it has problems, DCP's targets."""
    flat, mappings = flatten_state_dict(state)
    load = CrossLoad(plan_load(saved, own_entries(flat)), flat, dict(mappings))
    if load.plan.problems:
        return load
    load.targets = {k: v for k, v in flat.items() if k not in load.plan.skip}
    for param in load.plan.to_kahan:
        key = MODEL + param
        dtype = getattr(torch, str(saved[key].dtype))
        load.targets[key] = load.masters[param] = torch.empty_like(flat[key], dtype=dtype)
    for param in load.plan.from_kahan:
        key = _compensation(param)
        dtype = getattr(torch, str(saved[key].dtype))
        load.targets[key] = load.compensations[param] = torch.empty_like(
            flat[MODEL + param], dtype=dtype
        )
    return load


@torch.no_grad()
def finish(load: CrossLoad) -> dict[str, Any]:
    """After DCP read ``load.targets``: the conversions, then the nested state."""
    flat = load.flat
    for key, value in load.targets.items():
        if not isinstance(value, torch.Tensor):
            flat[key] = value  # a pickled value DCP replaced in the targets dict
    for param, master in load.masters.items():
        weight = local_shard(flat[MODEL + param])
        m = local_shard(master)
        weight.copy_(m)  # rounded to nearest, as BF16AdamW rounds the master
        local_shard(flat[_compensation(param)]).copy_(m.sub_(weight.to(m.dtype)))
    for param, comp in load.compensations.items():
        weight = local_shard(flat[MODEL + param])
        weight.add_(local_shard(comp).to(weight.dtype))  # the master the pair stood for
    masters = set(load.masters)
    for key in load.plan.skip:  # a compensation with no wider master: starts at zero
        if key.endswith(f".{COMPENSATION}") and key[len(STATE):].rpartition(".")[0] not in masters:
            local_shard(flat[key]).zero_()
    return dict(unflatten_state_dict(flat, load.mappings))
