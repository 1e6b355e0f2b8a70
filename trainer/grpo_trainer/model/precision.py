"""What ``actor.precision`` changes: where parameters are stored and which optimizer steps them.

``mixed`` (default): float32 parameters, gradients and AdamW state; FSDP2 gathers the
parameters in the compute dtype (``actor.dtype``). ``bf16``: the parameters are stored
in bf16, so FSDP2 keeps their sharded gradients in bf16 too, and ``BF16AdamW`` keeps
its moments and Kahan compensation in bf16: 10 bytes per trainable parameter instead
of 16. Compute still happens in ``actor.dtype`` (float32 on CPU: the bf16 weights are
widened exactly when gathered) and gradients are still reduced in float32
(``MixedPrecisionPolicy.reduce_dtype``, in ``modeling.shard_model``).

What stays float32 and why: the buffers. Rotary ``inv_freq`` tables are buffers, and
a position angle ``pos * inv_freq`` in bf16 is off by whole radians at a few thousand
tokens; they are never cast. RMSNorm weights are parameters and FSDP2 needs one dtype
for the trainable parameters of a unit, so they are bf16 like the rest: the norm's
arithmetic (variance, rsqrt) runs in float32 inside the HF module regardless, and
Kahan compensation keeps their small updates.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from grpo_api.trainer_config import ActorConfig

from ..optim import BF16AdamW

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def storage_dtype(actor: ActorConfig, trainable: bool = True) -> torch.dtype:
    """The dtype the sharded parameters are kept in. A frozen copy (the reference model)
    is only ever gathered for forward, so it is kept in the compute dtype: FSDP2 would
    cast float32 shards to it anyway, and the planner budgets it so (2 bytes a
    parameter on GPUs)."""
    if not trainable:
        return DTYPES[actor.dtype]
    return torch.bfloat16 if actor.precision == "bf16" else torch.float32


def store_params(model: nn.Module, actor: ActorConfig, trainable: bool = True) -> None:
    """Cast the parameters (never the buffers) to the storage dtype, before ``fully_shard``.

    Works on meta parameters too; a tied parameter is one object and is cast once.
    """
    dtype = storage_dtype(actor, trainable)
    if dtype == torch.float32:
        return  # mixed: untouched, bit for bit as before
    with torch.no_grad():
        for param in model.parameters():
            if param.is_floating_point() and param.dtype != dtype:
                param.data = param.data.to(dtype)


def build_optimizer(params: Iterable[torch.Tensor], actor: ActorConfig) -> torch.optim.Optimizer:
    if actor.precision == "bf16":
        return BF16AdamW(
            params,
            lr=actor.lr,
            betas=actor.betas,
            weight_decay=actor.weight_decay,
            compensation="kahan",
        )
    return torch.optim.AdamW(
        params,
        lr=actor.lr,
        betas=actor.betas,
        weight_decay=actor.weight_decay,
        # One kernel over all parameters instead of a dozen DTensor ops per
        # parameter (10x less optimizer time on CPU; also the fast path on CUDA).
        fused=True,
    )
