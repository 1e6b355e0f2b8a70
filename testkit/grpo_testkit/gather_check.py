"""Rank function for the bucketed parameter gather test (spawned ranks import it by name)."""

from __future__ import annotations

from typing import Any


def compare_gathers(rank: int, world: int, arg: Any) -> dict[str, dict[str, Any]]:
    """Shard the model at ``arg["model"]`` over the ranks; gather it both ways, in each
    of ``arg["dtypes"]``."""
    import torch
    import torch.distributed as dist

    from grpo_api.trainer_config import ActorConfig, ModelConfig
    from grpo_trainer.model.modeling import build_sharded, stream_full_params
    from grpo_trainer.model.param_gather import GatherItem, gather_full_params, plan_buckets

    torch.set_num_threads(1)
    actor = ActorConfig(dtype="float32")
    model = build_sharded(
        ModelConfig(path=arg["model"]), actor, torch.device("cpu"), trainable=True
    )
    results: dict[str, dict[str, Any]] = {}
    for name in arg["dtypes"]:
        dtype = getattr(torch, name)
        reference = {n: t.clone() for n, t in stream_full_params(model, dtype)}
        # A small bucket forces several collectives and big parameters alone in theirs.
        calls: list[int] = []
        real = dist.all_gather_into_tensor

        def counted(*a: Any, _real: Any = real, _calls: list[int] = calls, **k: Any) -> Any:
            _calls.append(1)
            return _real(*a, **k)

        dist.all_gather_into_tensor = counted
        try:
            bucketed = [
                (n, t.clone()) for n, t in gather_full_params(model, dtype, arg["bucket_bytes"])
            ]
        finally:
            dist.all_gather_into_tensor = real
        items = [GatherItem(tuple(p.shape), "mesh", world) for p in model.parameters()]
        itemsize = torch.empty((), dtype=dtype).element_size()
        results[name] = {
            "names": [n for n, _ in bucketed],
            "reference_names": list(reference),
            "max_abs_diff": max(float((t - reference[n]).abs().max()) for n, t in bucketed),
            "shapes_match": all(t.shape == reference[n].shape for n, t in bucketed),
            "dtypes": sorted({str(t.dtype) for _, t in bucketed}),
            "collectives": len(calls),
            "planned": len(plan_buckets(items, itemsize, arg["bucket_bytes"])),
            "parameters": len(items),
        }
    return results
