"""The memory watchdog on the real loop: a real injected leak is flagged, a clean run is not.

Both runs are the real trainer (Ray, 2 FSDP ranks, tiny Qwen2) with small batches
and 4-token responses so a step takes well under a second.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_text_task
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.liveness.progress import JsonFileProgressReporter
from grpo_trainer.liveness.watchdog import MiB, slope

pytestmark = pytest.mark.trainer

# The bound the clean run's RSS must stay within after warm-up (docs/trainer.md):
# measured ~5 MiB over 55 steps (~0.07 MiB/step) per rank.
FLAT_RANGE_MIB = 32
FLAT_SLOPE_MIB_PER_STEP = 0.5


def _run(
    model: Path,
    tmp_path: Path,
    steps: int,
    *,
    fault: str | None = None,
    actor: dict[str, Any] | None = None,
) -> tuple[list[dict[str, float]], dict[str, Any]]:
    data = write_text_task(tmp_path / "text.jsonl")
    raw = text_config(
        model,
        data,
        rollout={"n": 2, "max_new_tokens": 4},
        actor={"micro_batch_size": 2, **(actor or {})},
        trainer={"total_steps": steps, "rollout_batch_size": 2, "fault_inject": fault},
        metrics={"jsonl": False},
    )
    cfg = build_config(raw, environ={})
    progress = tmp_path / "progress.json"
    trainer = GRPOTrainer(cfg, reporter=JsonFileProgressReporter(progress, 0.0))
    try:
        history = trainer.run()
    finally:
        trainer.close()
    return history, json.loads(progress.read_text())


def test_an_injected_host_leak_is_flagged_within_20_steps(
    tiny_lm: Path, tmp_path: Path, ray_local: None
) -> None:
    # From step 6 (after the default 5 warm-up steps) every rank keeps 4 MiB more
    # per step: a real leak in the real loop.
    history, progress = _run(tiny_lm, tmp_path, 25, fault="leak_host:4@step=6")
    flagged = [i + 1 for i, m in enumerate(history) if m["memory/growth_flag"]]
    assert flagged and flagged[0] <= 6 + 19, flagged
    last = history[-1]
    for rank in (0, 1):
        assert last[f"memory/rank{rank}/host_rss_growth_flag"] == 1.0
        rate = last[f"memory/rank{rank}/host_rss_growth_bytes_per_step"] / MiB
        assert 3.0 < rate < 6.0, rate
    assert last["memory/driver/host_rss_growth_flag"] == 0.0
    growth = progress["memoryGrowth"]
    assert "host RSS of rank 0 grew" in growth and "host RSS of rank 1 grew" in growth
    assert "MiB/step over the last 20 steps" in growth
    # The attempt's highest readings, what the MemoryPlan condition holds to the plan: the
    # leaking ranks' RSS at its largest, read at step ends (status.progress.measuredPeaks).
    peaks = progress["measuredPeaks"]
    worst = max(m["memory/host_rss_bytes"] for m in history) / 2**30
    assert peaks["hostRankGiB"] == pytest.approx(worst, abs=1e-3)
    assert peaks["driverGiB"] == pytest.approx(
        max(m["memory/driver/host_rss_bytes"] for m in history) / 2**30, abs=1e-3)
    assert (peaks["attempt"], peaks["step"], peaks["gpuGiB"]) == (0, 25, {})  # CPU ranks


def test_a_clean_60_step_run_with_offload_is_flat_and_not_flagged(
    tiny_lm: Path, tmp_path: Path, ray_local: None
) -> None:
    # On CPU the offload flags are accepted and change nothing (parameters and
    # optimizer state are host memory already); the run must stay flat with them.
    history, progress = _run(
        tiny_lm,
        tmp_path,
        60,
        actor={"offload_params": True, "offload_optimizer": True},
    )
    assert not any(m["memory/growth_flag"] for m in history)
    assert progress["memoryGrowth"] is None  # sent as null: a merge patch clears it
    for process in ("driver", "rank0", "rank1"):
        rss = [m[f"memory/{process}/host_rss_bytes"] / MiB for m in history[5:]]
        assert max(rss) - min(rss) < FLAT_RANGE_MIB, (process, rss)
        assert slope(rss) < FLAT_SLOPE_MIB_PER_STEP, (process, rss)
