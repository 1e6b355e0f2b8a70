"""Rank-0 init through ``rank0_init.load_from_rank0`` against torch's own broadcast, on
spawned gloo ranks (tests/trainer/test_rank0_init.py). On CPU both run on gloo;
what the test checks is that the shards each rank keeps are torch's, to the bit."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def rank_shards(rank: int, world: int, model_dir: str) -> dict[str, Any]:
    """This rank's local shards after ``build_sharded``'s rank-0 init (torch's broadcast
    on CPU) and after the same prologue with ``load_from_rank0``."""
    from grpo_api.trainer_config import ActorConfig, InitStrategy, ModelConfig
    from grpo_trainer.model import modeling
    from grpo_trainer.model.precision import storage_dtype
    from grpo_trainer.model.rank0_init import load_from_rank0

    mcfg = ModelConfig(path=model_dir)
    actor = ActorConfig(init_strategy=InitStrategy.RANK0, dtype="float32")
    cpu = torch.device("cpu")
    torch.manual_seed(0)
    theirs = modeling.build_sharded(mcfg, actor, cpu, trainable=True)
    model = (modeling.load_full(mcfg, storage_dtype(actor, True)) if rank == 0
             else modeling._build_on_meta(mcfg))
    modeling._prepare(model, actor, True)
    full_sd = {k: v.detach() for k, v in model.state_dict().items()} if rank == 0 else {}
    modeling.shard_model(model, actor, cpu, trainable=True)
    if rank != 0:
        modeling._materialise(model, cpu, cpu)
    load_from_rank0(model, full_sd, cpu)
    dist.barrier()

    def local(m: torch.nn.Module) -> dict[str, torch.Tensor]:
        return {n: (t.to_local() if hasattr(t, "to_local") else t).detach().clone()
                for n, t in m.state_dict().items()}

    return {"theirs": local(theirs), "ours": local(model)}
