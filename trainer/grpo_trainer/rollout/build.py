"""A colocated rank's rollout engine (worker.py): vLLM over the ranks' tensor-parallel
groups, or the hf engine on an unsharded copy of the policy."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from grpo_api.trainer_config import Config

from ..algorithm.samples import RolloutTokens
from ..media.videos import same_normalisation
from ..model.modeling import load_full
from ..model.rank_state import RankState
from .base import RolloutEngine

if TYPE_CHECKING:
    from .vllm_engine import VLLMEngineConfig


def vllm_config(cfg: Config, hf_config: Any, compute_dtype: torch.dtype, tokens: RolloutTokens,
                prompts: int, *, tp: int, sleep: bool, lora_rank: int) -> VLLMEngineConfig:
    """One vLLM engine's settings for ``prompts`` prompts a step (x rollout.n sequences
    at once): a colocated TP group's, or a disaggregated engine's (engine_actor.py)."""
    from .vllm_engine import VLLMEngineConfig, kv_cache_bytes

    seqs = prompts * cfg.rollout.n
    videos = cfg.data.max_videos_per_prompt
    max_len = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
    return VLLMEngineConfig(
        model_path=cfg.model.path,
        dtype=cfg.actor.dtype,
        tensor_parallel_size=tp,
        max_model_len=max_len,
        max_num_seqs=seqs,
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        cpu_kv_cache_bytes=kv_cache_bytes(hf_config, compute_dtype, seqs * max_len, tp),
        seed=cfg.rollout.seed,
        enable_sleep_mode=sleep,
        trust_remote_code=cfg.model.trust_remote_code,
        # The most images a loaded prompt has (the driver's sized_for_images).
        max_images_per_prompt=cfg.data.max_images_per_prompt,
        lora_rank=lora_rank,
        image_bounds=tokens.encoder.bounds,
        # The most videos a loaded prompt has (data.max_videos_per_prompt, lowered to the
        # data's at load), and how the ranks sample and size their frames.
        max_videos_per_prompt=videos,
        video_spec=tokens.encoder.video_spec if videos else None,
        device_normalize=not videos or same_normalisation(tokens.encoder.processor),
    )


def build_rank_engine(cfg: Config, state: RankState, tokens: RolloutTokens,
                      world_size: int) -> RolloutEngine:
    if cfg.rollout.engine == "vllm":
        from .sync_check import check_weight_sync
        from .vllm_engine import VLLMEngine

        if cfg.actor.lora is None:  # each sync sends every weight: names and shapes
            check_weight_sync(state.actor, cfg.model.path)
        tp = cfg.rollout.tensor_parallel_size
        return VLLMEngine(vllm_config(
            cfg, state.actor.config, state.compute_dtype, tokens,
            cfg.trainer.rollout_batch_size // world_size * tp, tp=tp,
            sleep=cfg.rollout.enable_sleep_mode,
            lora_rank=cfg.actor.lora.rank if cfg.actor.lora else 0))
    from .hf import HFGenerateEngine

    model = load_full(cfg.model, state.compute_dtype).to(state.device)
    return HFGenerateEngine(model, tokens.pad_id, tokens.eos_ids, cfg.rollout.hf_sampler)
