"""Crash-safe, reshardable checkpoints (torch.distributed.checkpoint) and HF export.

``checkpointer`` is the ``Checkpointer`` protocol the driver calls, ``tracker`` the pure
layout/manifest/retention logic, ``files`` the durable writes, ``rank`` each worker's
side, ``dcp`` the driver's ``Checkpointer`` and ``export`` the offline conversion to a
Hugging Face directory.
"""

from __future__ import annotations

from grpo_api.trainer_config import Config

from .checkpointer import Checkpointer, NoCheckpointer


def make_checkpointer(cfg: Config, *, resume: bool = True) -> Checkpointer:
    """The DCP checkpointer when ``checkpoint.dir`` is set, else one that writes nothing."""
    if cfg.checkpoint.dir is None:
        return NoCheckpointer()
    from .dcp import DCPCheckpointer

    return DCPCheckpointer(cfg, resume=resume)
