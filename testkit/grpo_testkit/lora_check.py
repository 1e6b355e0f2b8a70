"""Rank function for the LoRA loading test (spawned ranks import it by name).

Builds the LoRA actor with one init strategy and compute dtype on every rank, runs
one forward and backward under FSDP2 with activation checkpointing, and returns what
the test compares: the full parameters, their dtypes, which ones train, and which
received gradients.
"""

from __future__ import annotations

from typing import Any


def build_lora_actor(rank: int, world: int, arg: dict[str, Any]) -> dict[str, Any]:
    import torch

    from grpo_api.trainer_config import ActorConfig, LoraConfig, ModelConfig
    from grpo_trainer.model.modeling import build_sharded, stream_full_params

    torch.manual_seed(arg.get("seed", 1))
    actor = ActorConfig(
        init_strategy=arg["strategy"],
        dtype=arg["dtype"],
        lora=LoraConfig(**arg["lora"]),
        # Recomputed blocks must still reach the adapters, though no input needs grad.
        gradient_checkpointing=True,
    )
    model = build_sharded(
        ModelConfig(path=arg["model"]), actor, torch.device("cpu"), trainable=True
    )
    model.train()  # HF checkpoints activations in train mode only
    dtypes = {n: str(p.dtype) for n, p in model.named_parameters()}
    trainable = sorted(n for n, p in model.named_parameters() if p.requires_grad)
    ids = torch.arange(1, 9).reshape(1, 8)
    out = model(input_ids=ids, use_cache=False)
    out.logits.float().pow(2).mean().backward()
    with_grad = sorted(n for n, p in model.named_parameters() if p.grad is not None)
    params = {n: t.clone() for n, t in stream_full_params(model, torch.float32)}
    return {"params": params, "dtypes": dtypes, "trainable": trainable, "with_grad": with_grad}
