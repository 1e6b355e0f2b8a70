"""Rank function for the vLLM tier's engine tests (spawned ranks import it by name).

One real ``Worker`` per rank (FSDP2 actor on gloo, vLLM engine through the external
launcher) runs: a rollout step, an optimizer step with a large learning rate, and
three scorings of the same (prompt, response) pairs by the engine: before the update,
after it with the engine NOT yet synced (stale), and after the worker's weight sync.
"""

from __future__ import annotations

from typing import Any


def rollout_update_sync(rank: int, world: int, arg: dict[str, Any]) -> dict[str, Any]:
    import torch

    from grpo_trainer.config import build_config
    from grpo_trainer.data import Record
    from grpo_trainer.rank.weight_sync import sync_rollout_weights
    from grpo_trainer.rank.worker import Worker
    from grpo_trainer.rollout.vllm_engine import VLLMEngine

    cfg = build_config(arg["config"], environ={})
    worker = Worker(cfg, rank, world)
    worker.setup("127.0.0.1", 0)  # the process group exists: run_ranks made it
    per_rank = len(arg["records"]) // world
    mine = [Record(**r) for r in arg["records"][rank * per_rank : (rank + 1) * per_rank]]
    worker.generate(mine, step=0)
    engine = worker.engine
    assert isinstance(engine, VLLMEngine)
    residue = vllm_residue(engine)  # after the rollout's sleep

    def actor_log_probs() -> list[torch.Tensor]:
        with torch.no_grad():
            logp, _, batch = worker.policy.log_probs(
                worker.state.actor, worker.samples, with_entropy=False
            )
            return [t.clone() for t in batch.gather(logp.cpu())]

    def gap(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
        return max(float((x - y).abs().max()) for x, y in zip(a, b, strict=True) if x.numel())

    def mean_gap_by_prompt(a: list[torch.Tensor], b: list[torch.Tensor]) -> dict[int, float]:
        """rollout/logprob_abs_diff_mean, each prompt's own: |a - b| over its tokens."""
        sums: dict[int, list[float]] = {}
        for s, x, y in zip(worker.samples, a, b, strict=True):
            acc = sums.setdefault(s.prompt.record.index, [0.0, 0.0])
            acc[0] += float((x - y).abs().sum())
            acc[1] += x.numel()
        return {i: total / max(n, 1.0) for i, (total, n) in sums.items()}

    before = actor_log_probs()
    scored = worker.score()
    synced_at_rollout = gap(scored, before)
    advantages = [1.0 if i % 2 else -1.0 for i in range(len(worker.samples))]
    worker.update(advantages, step=0)
    after = actor_log_probs()
    stale = gap(worker.score(), after)
    sync_rollout_weights(engine, worker.state.actor, worker.state.compute_dtype, cfg.actor.lora)
    synced = gap(worker.score(), after)
    generated: dict[int, list[list[int]]] = {}
    for s in worker.samples:
        generated.setdefault(s.prompt.record.index, []).append(s.response_ids.tolist())
    return {
        **residue,
        "generated": generated,
        "prompt_tokens": {s.prompt.record.index: int(s.prompt.input_ids.numel())
                          for s in worker.samples},
        "rollout_vs_actor": gap([s.rollout_log_probs for s in worker.samples], before),
        "rollout_vs_actor_by_prompt": mean_gap_by_prompt(
            [s.rollout_log_probs for s in worker.samples], before),
        "scored_vs_actor_by_prompt": mean_gap_by_prompt(scored, before),
        "synced_at_rollout": synced_at_rollout,
        "policy_moved": gap(before, after),
        "stale": stale,
        "synced": synced,
    }



def vllm_residue(engine: Any) -> dict[str, Any]:
    """What a sleeping engine still holds that the update's memory does not know about:
    the vision embeddings in the model runner's encoder cache, and whether vLLM's
    multimodal processor caches (host RAM) exist at all; and the image size it budgets."""
    llm = engine.llm
    core = llm.llm_engine.engine_core.engine_core  # in process: VLLM_ENABLE_V1_MULTIPROCESSING=0
    (entries,) = llm.collective_rpc(lambda worker: len(worker.model_runner.encoder_cache))
    # The most tokens vLLM expects of one image: what its start-up encoder profile and
    # encoder cache are sized by (empty for a text model).
    (budget,) = llm.collective_rpc(lambda worker: dict(
        getattr(worker.model_runner.mm_budget, "mm_max_toks_per_item", None) or {}))
    return {
        "encoder_cache_entries": entries,
        "max_tokens_per_item": budget,
        "mm_processor_caches": [type(c).__name__ for c in (
            llm.llm_engine.renderer.mm_processor_cache, core.mm_receiver_cache) if c is not None],
    }


def rollout_update_sync_on_discarded_weights(
    rank: int, world: int, arg: dict[str, Any]
) -> dict[str, Any]:
    """``rollout_update_sync`` on an engine whose weights are all noise before the first
    sync: what a CUDA engine holds after waking from a level-2 sleep, which the CPU build
    (no sleep mode) cannot produce. vLLM's dummy loader gives every parameter random
    values; it randomises persistent buffers too, which level 2 keeps (vLLM copies them to
    host and back), so the one module holding such buffers (Qwen2.5-VL's on-device image
    normalisation) is left out and the processor normalises instead.

    Adds vLLM's own account of the first reload: the parameters it names as "not loaded"
    (the log-probs alone barely see a tiny vision tower's weights)."""
    import logging

    from grpo_trainer.rollout import vllm_engine

    vllm_engine.set_vllm_env()  # as VLLMEngine sets it, before vLLM
    from vllm.model_executor.model_loader.reload import inplace

    real = vllm_engine.engine_kwargs

    def discarded_weights_kwargs(*args: Any, **kwargs: Any) -> dict[str, Any]:
        return {**real(*args, **kwargs), "load_format": "dummy", "mm_device_do_normalize": False}

    vllm_engine.engine_kwargs = discarded_weights_kwargs
    unloaded: list[str] = []

    class Unloaded(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if "were not loaded" in record.getMessage():
                unloaded.append(record.getMessage())
            return True

    # A filter, not a handler: vLLM configures logging again when the engine starts,
    # which drops the handlers of its loggers but keeps their filters.
    logging.getLogger(inplace.__name__).addFilter(Unloaded())
    return {**rollout_update_sync(rank, world, arg), "unloaded": unloaded}
