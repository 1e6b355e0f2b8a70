"""One real ``Worker`` update per named config on spawned gloo ranks (spawned ranks import
it by name): the step's metrics, every forward of the update as collated (its samples
and tokens, padding included, in order: old, reference, then the update's micro-batches)
and the parameters after it. Used by tests/trainer/test_token_budget.py."""

from __future__ import annotations

import gc
from typing import Any

from grpo_trainer.algorithm.samples import Sample, TrainBatch


def rank_update(rank: int, world: int, arg: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """For each named mode in ``arg`` (``{"config": raw config, "samples": per rank
    [(Record fields, response ids)], "advantages": per rank [float]}``): a real
    ``Worker`` on this rank, its samples installed, one update."""
    from grpo_trainer.config import build_config
    from grpo_trainer.data import Record
    from grpo_trainer.rank.worker import Worker

    out: dict[str, Any] = {}
    for name, mode in arg.items():
        worker = Worker(build_config(mode["config"], environ={}), rank, world)
        worker.setup("127.0.0.1", 0)  # the process group exists: run_ranks made it
        worker.load_samples([(Record(**r), ids) for r, ids in mode["samples"][rank]])
        forwards: list[dict[str, int]] = []
        collate = worker.policy._collate

        def counted(micro: list[Sample], collate: Any = collate,
                    forwards: list[dict[str, int]] = forwards) -> TrainBatch:
            batch: TrainBatch = collate(micro)
            ids = batch.model_inputs["input_ids"]
            forwards.append({"samples": len(micro), "rows": ids.shape[0],
                             "tokens": ids.numel()})
            return batch

        worker.policy._collate = counted  # type: ignore[method-assign]
        metrics = worker.update(mode["advantages"][rank], step=1)
        params = worker.full_params()  # a collective: every rank
        out[name] = {"metrics": metrics, "forwards": forwards,
                     "params": params if rank == 0 else None}
        del worker
        gc.collect()
    return out
