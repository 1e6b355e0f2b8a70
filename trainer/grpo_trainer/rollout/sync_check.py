"""The weight sync's names and shapes checked against what vLLM loaded, before any
tensor moves (full fine-tuning with ``rollout.engine: vllm``).

The sync sends the actor's parameters under transformers' names, and vLLM's
``reload_weights(is_checkpoint_format=True)`` takes them as the checkpoint it loaded at
start-up: it maps checkpoint names onto its own (stacked q/k/v, merged experts) and
expects checkpoint layouts. That holds when transformers only renamed the checkpoint's
tensors on load (Qwen2.5-VL's ``model.layers.*`` is its ``model.language_model.layers.*``,
which vLLM's mapper knows). It does not when transformers converted a tensor: transformers
5 keeps Qwen3-VL MoE's fused experts transposed (its conversion mapping: ``Transpose`` of
``mlp.experts.gate_up_proj`` and ``mlp.experts.down_proj``), so the sync would send
``[experts, 2 x intermediate, hidden]`` where vLLM expects ``[experts, hidden, 2 x
intermediate]``: a size error at best, transposed weights when the two sizes are equal.
So every name the sync will send must map to a checkpoint tensor by renaming alone, with
the same shape, or the rank fails at start-up with the list (``ConfigError``, exit 2).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import cast

from torch import nn

from ..config_error import ConfigError
from ..model.sharded_load import (
    NotShardable,
    checkpoint_index,
    model_key_mapper,
    safetensors_layout,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Expected:
    """What vLLM loaded for one model parameter: its checkpoint tensor and shape, or the
    conversion transformers applied to it (then no sync of it can be right)."""

    checkpoint_key: str
    shape: tuple[int, ...]
    converted: str | None = None


def sync_problems(sent: Iterable[tuple[str, tuple[int, ...]]],
                  expected: Mapping[str, Expected]) -> list[str]:
    """Each way the names and shapes the sync sends differ from the checkpoint (pure)."""
    out = []
    for name, shape in sent:
        want = expected.get(name)
        if want is None:
            out.append(f"{name} {list(shape)}: no checkpoint tensor is renamed to it")
        elif want.converted is not None:
            out.append(f"{name} {list(shape)}: transformers converts checkpoint tensor "
                       f"{want.checkpoint_key} {list(want.shape)} on load ({want.converted}); "
                       "the engine expects the checkpoint's layout")
        elif tuple(shape) != want.shape:
            out.append(f"{name}: shape {list(shape)}, the checkpoint's {want.checkpoint_key} "
                       f"is {list(want.shape)}")
    return out


def _as_transformers_sees_it(model: nn.Module) -> nn.Module:
    """The model under its own class. FSDP2's ``fully_shard`` gives the root a class of
    its own (``FSDP<Class>``, a subclass), and transformers picks a model's checkpoint
    conversions by class name first (``conversion_mapping.get_model_conversion_mapping``),
    so on the sharded actor it would find no renaming (Qwen2.5-VL's ``model.layers`` ->
    ``model.language_model.layers``). A shallow copy with the original class sees the
    same submodules and leaves the actor alone."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        return model
    own = next(c for c in type(model).__mro__[1:] if not issubclass(c, FSDPModule))
    view = cast(nn.Module, object.__new__(own))  # no __init__: the same state, shared
    view.__dict__.update(model.__dict__)
    return view


def expected_layout(model: nn.Module, model_dir: str) -> dict[str, Expected]:
    """Model parameter name -> what the checkpoint in ``model_dir`` holds for it."""
    index = checkpoint_index(model_dir)
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(set(index.values())):
        _, layout = safetensors_layout(file)
        shapes |= {k: tuple(v[2]) for k, v in layout.items()}
    to_model = model_key_mapper(_as_transformers_sees_it(model),
                                model.state_dict(keep_vars=True))
    out: dict[str, Expected] = {}
    for key in index:
        name, converter = to_model(key)
        out.setdefault(name, Expected(key, shapes[key], converter))
    return out


def check_weight_sync(model: nn.Module, model_dir: str) -> None:
    """Fail (exit 2) when the sync would send a name or shape vLLM did not load; every
    rank decides alike from the same files. A model path that is no local directory of
    safetensors cannot be read here and is let through, logged."""
    try:
        expected = expected_layout(model, model_dir)
    except NotShardable as why:
        log.warning("weight sync not checked against the checkpoint: %s", why)
        return
    sent = [(n, tuple(p.shape)) for n, p in model.named_parameters()]
    problems = sync_problems(sent, expected)
    if problems:
        shown = "; ".join(problems[:6]) + (f"; and {len(problems) - 6} more"
                                           if len(problems) > 6 else "")
        raise ConfigError(
            "rollout.engine",
            f"vLLM cannot take this model's weights from the actor: {len(problems)} of "
            f"{len(sent)} tensors differ from the checkpoint it loaded ({shown}). Use "
            "rollout.engine: hf for this model")
