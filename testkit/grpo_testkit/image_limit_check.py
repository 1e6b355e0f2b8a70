"""Rank function for the vLLM tier's image-limit test (spawned ranks import it by name).

The driver's path on one rank: the data loaded (each row limited to
``data.max_images_per_prompt``), the config sized for it (``sized_for_media``), a vLLM
engine built from that config as the ranks and the engines apart build theirs
(rollout/build.py ``vllm_config``), and one generation over every prompt.
"""

from __future__ import annotations

from typing import Any


def generate_from_the_data(rank: int, world: int, arg: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig

    from grpo_trainer.algorithm.samples import load_rollout_tokens
    from grpo_trainer.config import build_config
    from grpo_trainer.dataset import PromptDataset, sized_for_media
    from grpo_trainer.rollout.base import SamplingSpec
    from grpo_trainer.rollout.build import vllm_config
    from grpo_trainer.rollout.vllm_engine import VLLMEngine

    cfg = build_config(arg["config"], environ={})
    dataset = PromptDataset(cfg.data.train_files, cfg.data)
    records = dataset.records
    cfg = sized_for_media(cfg, dataset)
    hf_config = AutoConfig.from_pretrained(cfg.model.path)
    tokens = load_rollout_tokens(cfg, hf_config)
    engine = VLLMEngine(vllm_config(cfg, hf_config, torch.float32, tokens, len(records), tp=1,
                                    sleep=False, lora_rank=0))
    prompts = [tokens.encoder.encode(r) for r in records]
    spec = SamplingSpec(n=2, temperature=1.0, top_p=1.0, max_new_tokens=4, seed=0,
                        suppress_ids=tokens.suppress_ids)
    generated = engine.generate(prompts, spec)
    (runner,) = engine.llm.collective_rpc(lambda worker: type(worker.model_runner).__module__)
    return {
        "limit": cfg.data.max_images_per_prompt,
        "images": [len(p.images) for p in prompts],
        "generated": [[g.token_ids.tolist() for g in gens] for gens in generated],
        "runner": runner,
    }
