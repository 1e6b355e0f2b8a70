"""Loading Hugging Face models into FSDP2 without N full copies, and streaming them out.

``rank0``: rank 0 reads the safetensors, every other rank builds the model on the
meta device; after ``fully_shard`` the full state dict is broadcast from rank 0
and each rank keeps only its shard (FIELD-NOTES #1). ``naive``: every rank reads
everything (the benchmark baseline). ``sharded`` (each rank reads only its own
bytes) is issue 5's; until then it takes the rank-0 path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from .config import ActorConfig, InitStrategy, ModelConfig

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def is_vision_model(hf_config: Any) -> bool:
    return getattr(hf_config, "vision_config", None) is not None


def _auto_class(hf_config: Any) -> Any:
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if is_vision_model(hf_config) else AutoModelForCausalLM


def load_hf_config(cfg: ModelConfig) -> Any:
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(cfg.path, trust_remote_code=cfg.trust_remote_code)


def load_full(cfg: ModelConfig, dtype: torch.dtype) -> nn.Module:
    """The whole model on this process's CPU, read through the normal HF path."""
    hf_config = load_hf_config(cfg)
    model: nn.Module = _auto_class(hf_config).from_pretrained(
        cfg.path,
        dtype=dtype,
        attn_implementation=cfg.attn_implementation,
        trust_remote_code=cfg.trust_remote_code,
    )
    return model


def _build_on_meta(cfg: ModelConfig) -> nn.Module:
    hf_config = load_hf_config(cfg)
    with torch.device("meta"):
        model: nn.Module = _auto_class(hf_config).from_config(
            hf_config,
            dtype=torch.float32,
            attn_implementation=cfg.attn_implementation,
            trust_remote_code=cfg.trust_remote_code,
        )
    return model


def _blocks(model: nn.Module) -> list[nn.Module]:
    """Transformer blocks to shard one by one: decoder layers and vision blocks."""
    blocks: list[nn.Module] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.split(".")[-1] in ("layers", "blocks"):
            blocks.extend(module)
    return blocks


def shard_model(
    model: nn.Module, actor: ActorConfig, device: torch.device, *, trainable: bool
) -> nn.Module:
    """FSDP2 ``fully_shard`` per block then the root; fp32 master weights."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    compute = DTYPES[actor.dtype]
    mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    kwargs: dict[str, Any] = {"mp_policy": mp, "reshard_after_forward": actor.reshard_after_forward}
    if actor.offload_params and device.type == "cuda":
        # Params, grads and the optimizer step live on the host (FIELD-NOTES #2:
        # the planner budgets the host RAM this costs).
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    for block in _blocks(model):
        fully_shard(block, **kwargs)
    # The root's parameters (embeddings, head) are needed again right away in backward.
    fully_shard(model, **{**kwargs, "reshard_after_forward": False})
    if not trainable:
        model.requires_grad_(False)
        model.eval()
    return model


def build_sharded(
    mcfg: ModelConfig,
    actor: ActorConfig,
    device: torch.device,
    *,
    trainable: bool,
) -> nn.Module:
    """Load and shard with the configured init strategy; returns an FSDP2 module."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    rank = dist.get_rank()
    strategy = actor.init_strategy
    if strategy == InitStrategy.NAIVE:
        model = load_full(mcfg, torch.float32).to(device)
        _prepare(model, actor, trainable)
        return shard_model(model, actor, device, trainable=trainable)

    if rank == 0:
        model = load_full(mcfg, torch.float32)
        full_sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    else:
        model = _build_on_meta(mcfg)
        full_sd = {}
    _prepare(model, actor, trainable)
    shard_model(model, actor, device, trainable=trainable)
    if rank != 0:
        model.to_empty(device=device)
    set_model_state_dict(
        model,
        full_sd,
        options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
    )
    del full_sd
    # Non-persistent buffers (rotary inv_freq, ...) are not in the state dict and
    # are garbage after to_empty; take rank 0's.
    for _, buf in model.named_buffers():
        dist.broadcast(buf.data, src=0)
    return model


def _prepare(model: nn.Module, actor: ActorConfig, trainable: bool) -> None:
    cfg = getattr(model, "config", None)
    if cfg is not None:
        cfg.use_cache = False
    # Dropout would make the update's log-probs differ from the old ones at ratio 1.
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    if trainable and actor.gradient_checkpointing:
        model.gradient_checkpointing_enable(  # type: ignore[operator]
            gradient_checkpointing_kwargs={"use_reentrant": False}
        )


def stream_full_params(model: nn.Module, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) one parameter at a time; a collective, so all ranks iterate."""
    from torch.distributed.tensor import DTensor

    for name, param in model.named_parameters():
        t = param.detach()
        full = t.full_tensor() if isinstance(t, DTensor) else t
        yield name, full.to(dtype)
