"""bench/gpu_fidelity_rates.py: the update's model FLOPs and MFU, counted by hand."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from grpo_testkit.script_modules import load_script

pytestmark = pytest.mark.unit
BENCH = Path(__file__).resolve().parents[2] / "bench"


def _rates() -> object:
    return load_script(BENCH / "gpu_fidelity_rates.py")


SHAPE = SimpleNamespace(parameters=1100, vision_parameters=100, layers=2, hidden_size=4)


def test_update_flops_by_hand() -> None:
    r = _rates()
    # 2 samples of 10 tokens, one 196-pixel image each (one patch), full fine-tuning, one
    # forward-only pass (the reference): per token 6 x 1000 + 6 x 2 x 4 x 10 (attention)
    # for the update, 2 x 1000 + 480 / 3 for the reference; the tower 6 + 2 x 100.
    per_token = 6 * 1000 + 480 + 2 * 1000 + 160
    want = 2 * (10 * per_token + 1 * 100 * 8)
    assert r.update_flops(SHAPE, 2, 10, 196, lora=False, forward_passes=1) == want  # type: ignore[attr-defined]
    # LoRA: no weight gradients of the frozen base (4 N, not 6 N); no forward pass besides.
    lora = 2 * (10 * (4 * 1000 + 480) + 1 * 100 * 4)
    assert r.update_flops(SHAPE, 2, 10, 196, lora=True, forward_passes=0) == lora  # type: ignore[attr-defined]


def test_mfu_is_the_model_flops_rate_over_the_cards_dense_peak() -> None:
    r = _rates()
    geo = SimpleNamespace(global_batch_size=2, sequence_length=10, max_pixels=196, lora=None,
                          shape=SHAPE)
    entry = {"metrics": {"time/old_logprob_s": 0.0, "time/ref_logprob_s": 0.5,
                         "time/update_s": 1.5}}
    got = r.rates(entry, SimpleNamespace(geometry=geo), "H100-80GB", 2)  # type: ignore[attr-defined]
    flops = r.update_flops(SHAPE, 2, 10, 196, False, 1)  # type: ignore[attr-defined]
    assert got["tokens_per_s"] == pytest.approx(20 / 2.0)
    assert got["mfu"] == pytest.approx(flops / 2.0 / 989.4e12)
    assert r.rates({"metrics": {}}, SimpleNamespace(geometry=geo), "H100-80GB", 2) is None  # type: ignore[attr-defined]
