"""Rank function for the vLLM tier's video test (spawned ranks import it by name).

One rank, one Qwen-VL family: the trainer's encoder and a vLLM engine built as the ranks
build theirs (rollout/build.py ``vllm_config``), video prompts encoded once and handed to
both. Returns what the test compares: vLLM's expanded prompt against the trainer's (every
token, not only the count the engine checks), its generations, and vLLM's log-probs of a
response against the transformers model's on the trainer's inputs (the same frames, grid
and temporal positions give the same numbers).
"""

from __future__ import annotations

from typing import Any


def generate_with_videos(rank: int, world: int, arg: dict[str, Any]) -> dict[str, Any]:
    import torch
    from transformers import AutoConfig
    from vllm import SamplingParams

    from grpo_trainer.algorithm.grpo_math import log_probs_from_logits
    from grpo_trainer.algorithm.samples import Sample, collate_train, load_rollout_tokens
    from grpo_trainer.config import build_config
    from grpo_trainer.data import Record
    from grpo_trainer.model.modeling import load_full
    from grpo_trainer.rollout.base import SamplingSpec
    from grpo_trainer.rollout.build import vllm_config
    from grpo_trainer.rollout.vllm_engine import VLLMEngine, _inputs

    cfg = build_config(arg["config"], environ={})
    hf_config = AutoConfig.from_pretrained(cfg.model.path)
    tokens = load_rollout_tokens(cfg, hf_config)
    records = [Record(**r) for r in arg["records"]]
    engine = VLLMEngine(vllm_config(cfg, hf_config, torch.float32, tokens, len(records), tp=1,
                                    sleep=False, lora_rank=0))
    prompts = [tokens.encoder.encode(r) for r in records]
    spec = SamplingSpec(n=2, temperature=1.0, top_p=1.0, max_new_tokens=4, seed=0,
                        suppress_ids=tokens.suppress_ids)
    generated = engine.generate(prompts, spec)  # fails on a prompt length vLLM disagrees on
    expanded = engine.llm.generate(_inputs(prompts), SamplingParams(max_tokens=1),
                                   use_tqdm=False)
    responses = [gens[0].token_ids.tolist() for gens in generated]
    scored = engine.score(prompts, responses)

    model = load_full(cfg.model, torch.float32)  # as the trainer loads it (video positions)
    samples = [Sample(p, torch.tensor(r, dtype=torch.long), torch.zeros(len(r)), True)
               for p, r in zip(prompts, responses, strict=True)]
    batch = collate_train(samples, tokens.pad_id)
    with torch.no_grad():
        logits = batch.response_logits(model(**batch.model_inputs, use_cache=False).logits)
    actor = batch.gather(log_probs_from_logits(logits.float(), batch.labels))
    mm_config = engine.llm.llm_engine.model_config.multimodal_config
    assert mm_config is not None  # a VLM's
    return {
        "trainer_ids": [p.input_ids.tolist() for p in prompts],
        "counted": [tokens.encoder.count_tokens(r) for r in records],
        "vllm_ids": [list(o.prompt_token_ids or []) for o in expanded],
        "generated": [[g.token_ids.tolist() for g in gens] for gens in generated],
        "score_gap": [float((s - a).abs().max()) if len(r) else 0.0
                      for s, a, r in zip(scored, actor, responses, strict=True)],
        "frames": [[list(v.frames.shape) for v in p.videos] for p in prompts],
        # Where vLLM normalised the pixels (True: on the device, with the image processor's
        # mean and std for every modality).
        "device_normalize": bool(mm_config.mm_device_do_normalize),
    }
