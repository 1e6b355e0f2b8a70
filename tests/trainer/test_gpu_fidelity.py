"""bench/gpu_fidelity.py's CPU smoke run, so the GPU fidelity check cannot rot unseen.

The same path as on a GPU - plan a one-GPU job, render the trainer config, write a
random checkpoint, then in a forked process load it with FSDP2 (gloo here, NCCL there),
run a real update step and count the tensors - on the tiny Qwen2.5-VL, for mixed, bf16
and LoRA. On a CPU "measured" is the bytes of live tensors, so the test checks what
those bytes must be whatever the planner says: each mode's bytes per parameter.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.trainer, pytest.mark.timeout(1200)]
ROOT = Path(__file__).resolve().parents[2]


def _components(case: dict[str, Any]) -> dict[str, float]:
    return {c["component"]: c["measured"] for c in case["comparison"]["components"]}


def test_cpu_smoke_run_measures_every_mode_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "fidelity.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_fidelity.py"), "--device", "cpu",
         "--steps", "1", "--workdir", str(tmp_path / "work"), "--out", str(out)],
        capture_output=True, text=True, timeout=1100, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    print(proc.stdout[-6000:])  # shown if anything below fails: progress lines, the table
    print(proc.stderr[-4000:], file=sys.stderr)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = json.loads(out.read_text())
    cases = {c["case"]: c for c in report["cases"]}
    assert sorted(cases) == ["tiny-bf16", "tiny-lora", "tiny-mixed"]
    for name, case in cases.items():
        assert case["error"] is None, (name, case["error"])
        stages = {p["stage"]: p for p in case["comparison"]["stages"]}
        assert sorted(stages) == ["load", "training"], name
        for p in stages.values():
            assert p["planned"] > 0 and p["measured"] > 0, (name, p)
            assert p["ratio"] == pytest.approx(p["measured"] / p["planned"]), (name, p)
        assert f"{name} ({case['mode']})" in proc.stdout  # the table names every case

    mixed, bf16, lora = (_components(cases[n]) for n in ("tiny-mixed", "tiny-bf16", "tiny-lora"))
    # float32 weights and gradients in mixed precision, bf16 in bf16 (the same parameters).
    assert mixed["weights"] == pytest.approx(2 * bf16["weights"], rel=1e-3)
    assert mixed["grads"] == pytest.approx(mixed["weights"], rel=1e-3)
    assert bf16["grads"] == pytest.approx(bf16["weights"], rel=1e-3)
    # AdamW: two float32 moments; BF16AdamW: two bf16 moments and a bf16 compensation.
    assert mixed["optimizer"] == pytest.approx(2 * mixed["weights"], rel=0.01)
    assert bf16["optimizer"] == pytest.approx(3 * bf16["weights"], rel=0.01)
    # LoRA: the base frozen in bf16 (every parameter of the model, as bf16 stores them),
    # float32 adapters with their gradients and moments, no reference copy.
    assert lora["frozen"] == pytest.approx(bf16["weights"], rel=1e-3)
    assert lora["grads"] == pytest.approx(lora["weights"], rel=1e-3)
    assert lora["optimizer"] == pytest.approx(2 * lora["weights"], rel=0.01)
    assert lora["reference_model"] == 0.0
    assert mixed["reference_model"] > 0 and bf16["reference_model"] > 0
    # The host side and the update's rate, as a lent GPU will report them (issue 43): the
    # rank's sampled RSS peak, its planned host terms, and tokens/s with the FLOPs model.
    for name, case in cases.items():
        host, rate = case["host"], case["rates"]
        assert host["rss_peak"] > 0 and host["planned_rank"] > 0, (name, host)
        assert host["pinned_peak"] is None  # nothing is pinned on a CPU
        assert rate["tokens_per_s"] > 0 and rate["tflops"] > 0, (name, rate)
        assert rate["peak_tflops"] == 989.4  # planned for an H100 on the CPU
        assert "tokens/s" in proc.stdout and "RSS peak" in proc.stdout


def test_first_checks_cpu_smoke_run(tmp_path: Path) -> None:
    """bench/gpu_first_checks.py, which a lent GPU runs before the cases: on a CPU the
    collated mask is aligned, the actor's tower runs in every forward and the text-only
    log-probs equal the unsharded model's, attention by segment gives the dense mask's
    log-probs, and the runner check answers."""
    out = tmp_path / "first.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_first_checks.py"), "--device", "cpu",
         "--out", str(out)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = json.loads(out.read_text())
    collated = report["mask-alignment"]["collation"]
    assert collated["shape"][-1] % 8 == 0 and collated["raw_width"] % 8 != 0
    mixed = report["text-beside-image"]
    assert mixed["tower_passes"] == mixed["expected_tower_passes"]
    assert mixed["text_logp_gap_vs_unsharded"] == 0.0
    assert report["vllm-runner"]["ok"] is True  # vLLM is installed on the CPU tiers
    # Attention by segment against the dense mask, in float32 here.
    assert report["segment-attention"]["ok"] and report["segment-attention"]["logp_gap"] < 1e-4
    assert proc.stdout.count("first-check ") == 4
