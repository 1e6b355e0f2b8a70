"""A text-only micro-batch on one FSDP2 rank beside an image micro-batch on another:
every rank runs every unit in every pass (vision_in_step.py), so the ranks neither hang
nor trade the wrong tensors, and the result is what one process computes.

Without the fix the text-only rank skips the vision blocks' all-gathers and gloo aborts
the image rank (``op.preamble.length <= op.nbytes``), or the ranks wait in a collective
until the spawn timeout. Tolerances: log-probs within 1e-6, gradients within 1e-5 of the
larger of 1 and their largest entry (float32; FSDP2's reduce-scatter sums in another
order than one process does: tests/trainer/test_lean_logprobs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from grpo_testkit.dist import run_ranks
from grpo_testkit.mixed_check import mixed_rank, one_process_reference
from grpo_trainer.model.vision_in_step import keep_vision_in_step

pytestmark = pytest.mark.trainer

# A hang is the failure this guards against: generous for a loaded 2-core machine (the
# passes themselves take a few seconds), far below gloo's 30-minute default.
TIMEOUT_S = 120.0


def test_text_only_rank_beside_image_rank_matches_one_process(tiny_vlm: Path) -> None:
    ranks = run_ranks(mixed_rank, 2, {"model": str(tiny_vlm)}, timeout_s=TIMEOUT_S)
    ref = one_process_reference(tiny_vlm)
    for rank, out in enumerate(ranks):
        for key in ("ref", "old", "logp"):  # the reference is the actor untrained here
            for a, b in zip(out[key], ref["logp"][rank], strict=True):
                torch.testing.assert_close(a, b, atol=1e-6, rtol=0)
    grads = ranks[0]["grads"]
    assert grads.keys() == ref["grads"].keys()
    tower = [n for n in grads if "visual" in n]
    assert tower, "the vision tower is trained"
    for name, g in ref["grads"].items():
        scale = max(1.0, float(g.abs().max()))
        err = float((grads[name] - g).abs().max())
        assert err <= 1e-5 * scale, (name, err)
    # The image rank's tower gradient arrived, halved by the text-only rank's zero one.
    assert any(float(grads[n].abs().max()) > 0 for n in tower)


def test_every_family_runs_its_tower_once_per_forward_and_adds_nothing(
    tiny_vl_families: dict[str, Path],
) -> None:
    """Without FSDP: a text-only forward of each family runs each vision block exactly
    once, as an image forward does, and its logits are bit-identical to the unhooked
    model.s."""
    from transformers import AutoModelForImageTextToText, AutoTokenizer

    for family, path in tiny_vl_families.items():
        model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(path)
        ids = tok("two plus two is", return_tensors="pt")
        with torch.no_grad():
            plain = model(**ids).logits
        calls: list[int] = []
        blocks = [m for n, m in model.named_modules() if n.endswith("visual.blocks.0")]
        assert len(blocks) == 1, family
        blocks[0].register_forward_hook(lambda *_, seen=calls: seen.append(1))
        assert keep_vision_in_step(model), family
        with torch.no_grad():
            hooked = model(**ids).logits
            model(**ids)
        assert torch.equal(plain, hooked), family
        assert len(calls) == 2, (family, len(calls))  # one tower pass per forward


def test_a_language_model_is_left_alone(tiny_lm: Path) -> None:
    from transformers import AutoModelForCausalLM

    assert not keep_vision_in_step(AutoModelForCausalLM.from_pretrained(tiny_lm))

