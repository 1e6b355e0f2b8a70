"""The chunked log-prob head against the full logits on the tiny models: the samples,
one forward and backward either way, and the FSDP2 rank function (spawned ranks import
it by name). Used by tests/trainer/test_lean_logprobs.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from grpo_trainer.algorithm.lean_logprobs import LogProbs, full_logits_log_probs, lean_log_probs
from grpo_trainer.algorithm.samples import PromptEncoder, Sample, TrainBatch, collate_train
from grpo_trainer.data import Record, load_template

from .datasets import png
from .samples import random_samples

TEMPERATURE = 0.8
CHUNK = 5  # several chunks per batch, one ending mid-sample
LENGTHS = [[5, 1, 9], [3, 8]]  # responses per prompt


def samples(model_dir: Path, vision: bool) -> tuple[list[Sample], int]:
    """Two prompts (with an image each for a VLM) and responses of very different
    lengths, one of a single token; and the pad id."""
    from transformers import AutoProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    processor = AutoProcessor.from_pretrained(model_dir) if vision else None
    enc = PromptEncoder(processor, tok, load_template("math"), None)
    images = [png((200, 30, 30), (44, 36))] if vision else []
    marker = "<image>" if vision else ""
    prompts = [enc.encode(Record(0, f"{marker}Say the number 7 please", "7", images)),
               enc.encode(Record(1, f"{marker}Count to three, slowly.", "3", images))]
    return random_samples(prompts, LENGTHS), int(tok.pad_token_id)


def run(model: torch.nn.Module, batch: TrainBatch, lean: bool, grad: bool = True
        ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Per-sample log-probs, and every trained parameter's gradient of a loss with an
    entropy bonus in it (``grad``; else under no_grad, no gradients)."""
    model.zero_grad(set_to_none=True)
    kwargs: dict[str, Any] = {"temperature": TEMPERATURE, "entropy": True, "entropy_grad": grad}
    inputs = dict(batch.model_inputs)
    out: LogProbs = (lean_log_probs(model, inputs, batch, chunk=CHUNK, **kwargs) if lean
                     else full_logits_log_probs(model, inputs, batch, **kwargs))
    if grad:
        assert out.entropy is not None
        mask = batch.response_mask
        weights = torch.linspace(-1.0, 1.0, mask.numel()).view(mask.shape) * mask
        ((out.logp * weights).sum() + 0.05 * (out.entropy * mask).sum()).backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()
             if p.grad is not None}
    return [lp.detach() for lp in batch.gather(out.logp)], grads


def fsdp_rank(rank: int, world: int, arg: dict[str, Any]) -> dict[str, Any]:
    """The actor and a reference of the tiny Qwen2.5-VL under FSDP2, float32 compute:
    this rank's log-probs (and the actor's gradient shards) both ways."""
    from grpo_api.trainer_config import ActorConfig, ModelConfig
    from grpo_trainer.model.modeling import load_full, shard_model

    actor_cfg = ActorConfig(dtype="float32", reshard_after_forward=True)
    cpu = torch.device("cpu")
    mcfg = ModelConfig(path=arg["model"])
    actor = shard_model(load_full(mcfg, torch.float32), actor_cfg, cpu, trainable=True)
    ref = shard_model(load_full(mcfg, torch.float32), actor_cfg, cpu, trainable=False)
    items, pad = samples(Path(arg["model"]), vision=True)
    batch = collate_train(items[rank::world], pad)
    out: dict[str, Any] = {}
    for lean in (True, False):
        logp, grads = run(actor, batch, lean)
        local = {n: g.to_local() if hasattr(g, "to_local") else g for n, g in grads.items()}
        with torch.no_grad():
            ref_logp, _ = run(ref, batch, lean, grad=False)
        out["lean" if lean else "full"] = {"logp": logp, "grads": local, "ref": ref_logp}
    return out
