"""The CPU rollout engine: its lean sampler matches transformers ``generate``, and its
log-probs are the ones the actor computes for the same tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_testkit.datasets import png
from grpo_trainer.algorithm.grpo_math import log_probs_from_logits
from grpo_trainer.algorithm.samples import PromptEncoder, Sample, collate_train
from grpo_trainer.data import Record, load_template
from grpo_trainer.rollout.base import SamplingSpec
from grpo_trainer.rollout.hf import HFGenerateEngine

pytestmark = pytest.mark.trainer


def _engine(path: Path, sampler: str) -> tuple[HFGenerateEngine, PromptEncoder, torch.nn.Module]:
    from transformers import (
        AutoConfig,
        AutoModelForCausalLM,
        AutoModelForImageTextToText,
        AutoProcessor,
        AutoTokenizer,
    )

    vlm = getattr(AutoConfig.from_pretrained(path), "vision_config", None) is not None
    cls = AutoModelForImageTextToText if vlm else AutoModelForCausalLM
    model = cls.from_pretrained(path, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(path)
    proc = AutoProcessor.from_pretrained(path) if vlm else None
    enc = PromptEncoder(proc, tok, load_template("math"), None)
    cfg = model.config.get_text_config()
    suppress = tuple(
        getattr(model.config, k)
        for k in ("image_token_id", "video_token_id")
        if getattr(model.config, k, None) is not None
    )
    engine = HFGenerateEngine(model, tok.pad_token_id, [cfg.eos_token_id], sampler)
    engine.suppress = suppress  # type: ignore[attr-defined]
    return engine, enc, model


@pytest.mark.parametrize("kind", ["text", "vision"])
def test_native_sampler_matches_generate_and_actor(
    tiny_lm: Path, tiny_vlm: Path, kind: str
) -> None:
    path = tiny_lm if kind == "text" else tiny_vlm
    images = [png((200, 30, 30), (44, 36))] if kind == "vision" else []
    records = [
        Record(0, "<image>What is 2 plus 3?", "5", images),
        Record(1, "Count to three, slowly and carefully.", "3", list(images)),
    ]
    native, enc, model = _engine(path, "native")
    reference, _, _ = _engine(path, "generate")
    prompts = [enc.encode(r) for r in records]
    spec = SamplingSpec(
        n=3, temperature=0.9, top_p=1.0, max_new_tokens=10, seed=1234, suppress_ids=native.suppress
    )  # type: ignore[attr-defined]
    ours = native.generate(prompts, spec)
    theirs = reference.generate(prompts, spec)
    flat_ours = [g for group in ours for g in group]
    flat_ref = [g for group in theirs for g in group]
    for g_ours, g_ref in zip(flat_ours, flat_ref, strict=True):
        assert torch.equal(g_ours.token_ids, g_ref.token_ids)
        torch.testing.assert_close(g_ours.log_probs, g_ref.log_probs, atol=1e-4, rtol=1e-4)

    # The actor's training forward (right-padded, whole sequences) gives the same
    # log-probs for the same tokens.
    samples = [
        Sample(p, g.token_ids, g.log_probs, g.finished)
        for p, gs in zip(prompts, ours, strict=True)
        for g in gs
    ]
    batch = collate_train(samples, native.pad_id)
    with torch.no_grad():
        logits = model(**batch.model_inputs, use_cache=False).logits[:, :-1] / 0.9
    actor = batch.gather(log_probs_from_logits(logits, batch.labels))
    for s, lp in zip(samples, actor, strict=True):
        torch.testing.assert_close(lp, s.rollout_log_probs, atol=1e-4, rtol=1e-4)
