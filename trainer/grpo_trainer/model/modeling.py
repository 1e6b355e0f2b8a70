"""Loading Hugging Face models into FSDP2 without N full copies, and streaming them out.

``rank0``: rank 0 reads the safetensors, every other rank builds the model on the
meta device; after ``fully_shard`` the full state dict is broadcast from rank 0
and each rank keeps only its shard (docs/incidents.md #1). ``sharded``: every rank
builds on the meta device, shards, and reads only its own rows of each tensor
from the memory-mapped safetensors (``sharded_load.py``); no rank ever holds the
whole model. ``naive``: every rank reads everything (the benchmark baseline).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from grpo_api.trainer_config import ActorConfig, InitStrategy, ModelConfig

from . import segment_attention
from .precision import DTYPES as DTYPES  # the compute dtypes by name; worker.py reads them here
from .precision import storage_dtype, store_params
from .rank0_init import broadcast_device, load_from_rank0
from .video_positions import match_vllm_video_positions
from .vision_in_step import keep_vision_in_step

log = logging.getLogger(__name__)


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
    # A video's positions as vLLM's (video_positions.py): the rollout samples at them.
    match_vllm_video_positions(model)
    return model


def _build_on_meta(cfg: ModelConfig) -> nn.Module:
    """Parameters on the meta device; buffers real (rotary ``inv_freq`` as ``__init__`` made it)."""
    from .sharded_load import params_on_meta

    hf_config = load_hf_config(cfg)
    with params_on_meta():
        model: nn.Module = _auto_class(hf_config).from_config(
            hf_config,
            dtype=torch.float32,
            attn_implementation=cfg.attn_implementation,
            trust_remote_code=cfg.trust_remote_code,
        )
    match_vllm_video_positions(model)  # as load_full
    return model


def _blocks(model: nn.Module) -> list[nn.Module]:
    """Transformer blocks to shard one by one: decoder layers and vision blocks."""
    blocks: list[nn.Module] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and name.split(".")[-1] in ("layers", "blocks"):
            blocks.extend(module)
    return blocks


def params_home(actor: ActorConfig, device: torch.device) -> torch.device:
    """Where the sharded parameters, their gradients and so the optimizer step live:
    host RAM with ``actor.offload_params`` on a GPU rank (FSDP2's ``CPUOffloadPolicy``),
    else the rank's device (a CPU rank's memory is host RAM already)."""
    if actor.offload_params and device.type == "cuda":
        return torch.device("cpu")
    return device


def shard_model(
    model: nn.Module, actor: ActorConfig, device: torch.device, *, trainable: bool,
    tower_passes: int = 1,
) -> nn.Module:
    """FSDP2 ``fully_shard`` per block then the root; parameters stored as ``actor.precision``
    says (float32 master weights, or bf16), gathered in ``actor.dtype``.

    A model that is not trained (the reference) is stored in ``actor.dtype`` and every
    unit, the root too, is resharded after forward: it never runs backward, so a unit
    kept gathered for one would stay gathered for good (docs/memory-model.md)."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    compute = DTYPES[actor.dtype]
    mp = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    reshard = actor.reshard_after_forward or not trainable
    kwargs: dict[str, Any] = {"mp_policy": mp, "reshard_after_forward": reshard}
    # bf16 storage for actor.precision bf16, the compute dtype for a frozen copy.
    store_params(model, actor, trainable)
    if params_home(actor, device) != device:
        # Params, grads and the optimizer step live on the host (docs/incidents.md #2:
        # the planner budgets the host RAM this costs).
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    for block in _blocks(model):
        fully_shard(block, **kwargs)
    # The root's parameters (embeddings, head) are needed again right away in backward.
    fully_shard(model, **{**kwargs, "reshard_after_forward": not trainable})
    # Each vision block is a unit: every rank must run the tower in every forward, as often
    # as any rank (twice with videos), or a text-only micro-batch issues fewer collectives
    # than an image one (vision_in_step.py).
    keep_vision_in_step(model, tower_passes)
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
    tower_passes: int = 1,
) -> nn.Module:
    """Load and shard with the configured init strategy; returns an FSDP2 module.
    ``tower_passes``: the vision tower's passes every forward makes
    (``vision_in_step.tower_passes``)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    rank = dist.get_rank()
    strategy = actor.init_strategy
    if strategy == InitStrategy.NAIVE:
        model = load_full(mcfg, storage_dtype(actor, trainable)).to(device)
        _prepare(model, actor, trainable)
        return shard_model(model, actor, device, trainable=trainable,
                           tower_passes=tower_passes)
    if strategy == InitStrategy.SHARDED:
        sharded = _build_sharded_read(mcfg, actor, device, trainable=trainable,
                                      tower_passes=tower_passes)
        if sharded is not None:
            return sharded

    # In the storage dtype: rank 0's full copy is half the size in bf16 mode.
    model = (
        load_full(mcfg, storage_dtype(actor, trainable)) if rank == 0 else _build_on_meta(mcfg)
    )
    _prepare(model, actor, trainable)
    # Taken after _prepare, which may add LoRA adapters (rank 0's initial values go
    # to every rank) and cast the frozen base. No copy: fully_shard puts each shard
    # in new storage and drops its reference to the full tensor, so these are the
    # only full copies.
    full_sd = {k: v.detach() for k, v in model.state_dict().items()} if rank == 0 else {}
    shard_model(model, actor, device, trainable=trainable, tower_passes=tower_passes)
    home = params_home(actor, device)
    if rank != 0:
        _materialise(model, device, home)
    if broadcast_device(device, home) != home:
        # Offloaded shards: torch would broadcast on the host, over gloo (rank0_init.py).
        load_from_rank0(model, full_sd, broadcast_device(device, home))
    else:
        set_model_state_dict(
            model,
            full_sd,
            options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True),
        )
    del full_sd
    # Non-persistent buffers (rotary inv_freq, ...) are not in the state dict; take
    # rank 0's, which went through from_pretrained.
    for _, buf in model.named_buffers():
        dist.broadcast(buf.data, src=0)
    return model


def _materialise(model: nn.Module, device: torch.device, params: torch.device) -> None:
    """Storage for the meta parameters (``to_empty``) on ``params`` (``params_home``: the
    host when FSDP offloads them, whose lazy init refuses a parameter anywhere else), and
    for the buffers on ``device``, where forward uses them, keeping the real buffers'
    values (rotary inv_freq, which from_config computed)."""
    buffers = {n: b.detach().clone() for n, b in model.named_buffers() if not b.is_meta}
    model.to_empty(device=params)
    with torch.no_grad():
        for module_name, module in model.named_modules():
            for name, buf in list(module._buffers.items()):
                if buf is None:
                    continue
                full = f"{module_name}.{name}" if module_name else name
                kept = buffers.get(full)
                module._buffers[name] = (kept if kept is not None else buf).to(device)


def _build_sharded_read(
    mcfg: ModelConfig, actor: ActorConfig, device: torch.device, *, trainable: bool,
    tower_passes: int = 1,
) -> nn.Module | None:
    """The ``sharded`` strategy; None (on every rank alike) if the checkpoint does not allow it."""
    from ..lora import reset_adapters
    from .sharded_load import NotShardable, plan_sources, read_local_shards

    model = _build_on_meta(mcfg)
    try:
        # Every rank plans from the same files, so every rank decides the same way.
        plan = plan_sources(model, mcfg.path)
    except NotShardable as why:
        log.warning("init_strategy sharded not possible (%s): loading through rank 0", why)
        return None
    _prepare(model, actor, trainable)
    shard_model(model, actor, device, trainable=trainable, tower_passes=tower_passes)
    _materialise(model, device, params_home(actor, device))
    t0 = time.perf_counter()
    nbytes = read_local_shards(model, plan)
    if trainable and actor.lora is not None:  # adapters are not in the files
        reset_adapters(model, torch.initial_seed())
    log.info(
        "rank %d read its shards: %.1f MiB in %.2f s",
        dist.get_rank(),
        nbytes / 2**20,
        time.perf_counter() - t0,
    )
    return model


def _prepare(model: nn.Module, actor: ActorConfig, trainable: bool) -> None:
    cfg = getattr(model, "config", None)
    if cfg is not None:
        cfg.use_cache = False
    # The packed update's attention by segment, not under a dense [rows, W, W] mask.
    if actor.segment_attention:
        segment_attention.install(model)
    # Dropout would make the update's log-probs differ from the old ones at ratio 1.
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
    if trainable and actor.lora is not None:
        from ..lora import attach_adapters

        attach_adapters(model, actor.lora, DTYPES[actor.dtype])
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
