"""Text-only and image micro-batches on different FSDP2 ranks (vision_in_step.py): the
rank function (spawned ranks import it by name) and the plain one-process reference.
Used by tests/trainer/test_mixed_image_text.py and bench/gpu_fidelity.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from grpo_trainer.algorithm.samples import collate_train

from .lean_check import run, samples


def batches(model_dir: Path) -> list[Any]:
    """[an image micro-batch, a text-only one] of the tiny VLM."""
    with_images, pad = samples(model_dir, vision=True)
    text_only, _ = samples(model_dir, vision=False)
    image_batch, text_batch = collate_train(with_images, pad), collate_train(text_only, pad)
    assert "pixel_values" in image_batch.model_inputs
    assert "pixel_values" not in text_batch.model_inputs
    return [image_batch, text_batch]


def mixed_rank(rank: int, world: int, arg: dict[str, Any]) -> dict[str, Any]:
    """Rank r takes micro-batch r of ``batches``: the reference's, the old and the
    update's passes as the trainer runs them (the chunked head), float32; returns this
    rank's log-probs and the full (reduced) gradient of every actor parameter."""
    from grpo_api.trainer_config import ActorConfig, ModelConfig
    from grpo_trainer.model.modeling import load_full, shard_model

    cfg = ActorConfig(dtype="float32", reshard_after_forward=True,
                      gradient_checkpointing=bool(arg.get("checkpointing", False)))
    cpu = torch.device("cpu")
    mcfg = ModelConfig(path=arg["model"])
    actor = shard_model(load_full(mcfg, torch.float32), cfg, cpu, trainable=True)
    ref = shard_model(load_full(mcfg, torch.float32), cfg, cpu, trainable=False)
    batch = batches(Path(arg["model"]))[rank]
    with torch.no_grad():
        ref_logp, _ = run(ref, batch, lean=True, grad=False)
        old_logp, _ = run(actor, batch, lean=True, grad=False)
    logp, grads = run(actor, batch, lean=True)
    full = {n: g.full_tensor() if hasattr(g, "full_tensor") else g for n, g in grads.items()}
    return {"ref": ref_logp, "old": old_logp, "logp": logp, "grads": full}


def one_process_reference(model_dir: Path,
                          batches_of: Callable[[Path], list[Any]] | None = None
                          ) -> dict[str, Any]:
    """The same passes without FSDP, both micro-batches in one process: each
    micro-batch's log-probs, and the mean of their gradients (FSDP2 averages the ranks'),
    a parameter a micro-batch leaves without gradient counting zero."""
    from grpo_api.trainer_config import ModelConfig
    from grpo_trainer.model.modeling import load_full

    model = load_full(ModelConfig(path=str(model_dir)), torch.float32)
    logps: list[list[torch.Tensor]] = []
    total: dict[str, torch.Tensor] = {}
    for batch in (batches_of or batches)(model_dir):
        logp, grads = run(model, batch, lean=True)
        logps.append(logp)
        for name, g in grads.items():
            total[name] = total.get(name, torch.zeros_like(g)) + g
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    mean = {n: total.get(n, torch.zeros_like(dict(model.named_parameters())[n])) / 2
            for n in names}
    return {"logp": logps, "grads": mean}
