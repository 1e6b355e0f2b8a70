"""What one rank trains: its config, place in the world, models, optimizer and scheduler.

``build_rank_state`` builds it once (``Worker.setup``; ``grpo_testkit/fidelity.py`` on a bare
GPU), and the same object is handed to the update (``PolicyUpdate``) and the checkpointer
(``checkpointing.rank.RankCheckpointer``): each is told explicitly what it works on,
and none reaches back into the ``Worker``. The rollout side (tokenizer, engine, samples)
stays the ``Worker``'s: neither reads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from grpo_api.trainer_config import ActorConfig, Config

from .modeling import DTYPES, build_sharded
from .precision import build_optimizer
from .vision_in_step import tower_passes


@dataclass(frozen=True)
class World:
    """This rank's place: its rank, how many ranks train, and the process group the
    update's own collectives (token counts, metric sums) run over (None: torch's
    default group, every rank)."""

    rank: int
    size: int
    group: dist.ProcessGroup | None = None


@dataclass
class RankState:
    """One rank's training state. The update steps the optimizer and scheduler, the
    checkpointer saves and loads them; a benchmark may swap the optimizer and scheduler
    (``bench/bench_bf16.py``), and both see the swap, holding this same object."""

    cfg: Config
    world: World
    device: torch.device
    compute_dtype: torch.dtype
    actor: nn.Module
    ref: nn.Module | None  # None without a KL term; the actor itself with LoRA
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    # Where the Adam moments live between steps: the host with
    # ``actor.offload_optimizer`` on a GPU rank, else ``device``.
    optimizer_home: torch.device

    def optimizer_state_to(self, device: torch.device) -> None:
        """Move the Adam moments (a no-op unless they live on the host between steps)."""
        if self.optimizer_home == self.device:
            return
        for state in self.optimizer.state.values():
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.device != device:
                    state[key] = value.to(device, non_blocking=True)


def optimizer_home(actor: ActorConfig, device: torch.device) -> torch.device:
    """Where the Adam moments live between steps: the host with ``actor.offload_optimizer``
    on a GPU rank, else the rank's device (on a CPU rank they are in host memory already).
    Only where: what a checkpoint holds is the same either way (DCP records no device)."""
    return torch.device("cpu") if actor.offload_optimizer and device.type == "cuda" else device


def build_scheduler(
    optimizer: torch.optim.Optimizer, actor: ActorConfig
) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warm-up over ``actor.warmup_steps``, then constant. It sets each param
    group's ``initial_lr``, which a checkpoint's optimizer state holds."""
    warmup = actor.warmup_steps
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
    )


def build_rank_state(
    cfg: Config,
    device: torch.device,
    world: World,
    on_built: Callable[[str], object] = lambda _: None,
) -> RankState:
    """Actor, reference, optimizer and LR scheduler on ``device``, in a started process
    group. ``on_built`` is told "load:actor" and "load:reference" as each is built
    (``bench/gpu_fidelity.py`` marks memory there)."""
    torch.manual_seed(cfg.trainer.seed)  # identical init everywhere (meta ranks overwrite)
    # Every rank's forwards run the vision tower as often: twice when prompts may have
    # videos (vision_in_step.py).
    passes = tower_passes(cfg.data.max_videos_per_prompt)
    actor = build_sharded(cfg.model, cfg.actor, device, trainable=True, tower_passes=passes)
    on_built("load:actor")
    ref: nn.Module | None = None
    if cfg.algorithm.kl_coef > 0:
        # LoRA: the reference is the actor itself with its adapters off (no copy).
        ref = actor if cfg.actor.lora else build_sharded(
            cfg.model, cfg.actor, device, trainable=False, tower_passes=passes
        )
    on_built("load:reference")
    # AdamW (fused, float32 state) or, for actor.precision bf16, BF16AdamW; with
    # LoRA only the adapters are trainable.
    optimizer = build_optimizer([p for p in actor.parameters() if p.requires_grad], cfg.actor)
    scheduler = build_scheduler(optimizer, cfg.actor)
    return RankState(
        cfg=cfg,
        world=world,
        device=device,
        compute_dtype=DTYPES[cfg.actor.dtype],
        actor=actor,
        ref=ref,
        optimizer=optimizer,
        scheduler=scheduler,
        optimizer_home=optimizer_home(cfg.actor, device),
    )
