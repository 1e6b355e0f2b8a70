"""The memory watchdog's growth detector and its outputs (pure; no torch, no Ray)."""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from grpo_api.trainer_config import MetricsConfig
from grpo_trainer.config import build_config
from grpo_trainer.config_error import ConfigError
from grpo_trainer.driver.metrics import MetricsLogger
from grpo_trainer.faults import leak_mib_per_step, parse_fault
from grpo_trainer.liveness.progress import Progress
from grpo_trainer.liveness.watchdog import (
    DetectorSettings,
    LeakDetector,
    MemoryWatchdog,
    MiB,
    per_process_memory,
    slope,
)

SETTINGS = DetectorSettings()  # the defaults: window 20, warm-up 5, 2 MiB/step
BASE = 900 * MiB


def flags(series: Sequence[float], settings: DetectorSettings = SETTINGS) -> list[bool]:
    det = LeakDetector(settings)
    return [det.observe(v).flagged for v in series]


def noise(n: int, seed: int, mib: float = 3.0) -> list[float]:
    rng = random.Random(seed)
    return [rng.gauss(0.0, mib * MiB) for _ in range(n)]


def test_slope_of_a_line_and_of_a_constant() -> None:
    assert slope([3.0 * i + 7 for i in range(10)]) == pytest.approx(3.0)
    assert slope([5.0] * 10) == 0.0
    assert slope([1.0]) == 0.0


@pytest.mark.parametrize("seed", range(5))
def test_flat_noisy_rss_is_not_flagged(seed: int) -> None:
    # Allocator noise of +-3 MiB (sd) around a flat line, 300 steps.
    assert not any(flags([BASE + n for n in noise(300, seed)]))


def test_a_step_change_that_stops_is_not_flagged() -> None:
    # A cache that fills once (+200 MiB at step 30) and then stays put.
    series = [BASE + (200 * MiB if i >= 30 else 0) + n for i, n in enumerate(noise(120, 1, 1))]
    assert not any(flags(series))


def test_two_plateaus_a_window_apart_are_not_flagged() -> None:
    series = [BASE + 100 * MiB * (i // 25) + n for i, n in enumerate(noise(75, 2, 1))]
    assert not any(flags(series))


@pytest.mark.parametrize("seed", range(5))
def test_linear_growth_is_flagged_once_the_window_is_full(seed: int) -> None:
    series = [BASE + 4 * MiB * i + n for i, n in enumerate(noise(60, seed, 1))]
    got = flags(series)
    first = got.index(True)
    # Warm-up (5) plus a full window (20): the 25th step at the earliest.
    assert first == SETTINGS.warmup_steps + SETTINGS.window_steps - 1
    assert all(got[first:])


def test_growth_below_the_threshold_is_not_flagged() -> None:
    series = [BASE + 1 * MiB * i for i in range(80)]
    assert not any(flags(series))


def test_the_flag_clears_when_growth_stops() -> None:
    series = [BASE + 4 * MiB * min(i, 40) for i in range(90)]
    got = flags(series)
    assert got[39] and not got[-1]


def test_watchdog_names_the_leaking_process_and_its_rate() -> None:
    wd = MemoryWatchdog(SETTINGS)
    out: dict[str, float] = {}
    for step in range(30):
        out = wd.observe(
            {
                "memory/driver/host_rss_bytes": 400 * MiB,
                "memory/rank0/host_rss_bytes": BASE,
                "memory/rank1/host_rss_bytes": BASE + 4.1 * MiB * step,
                "memory/host_rss_bytes": BASE + 4.1 * MiB * step,  # the max: not a series
                "reward/mean": 0.5,
            }
        )
    assert out["memory/growth_flag"] == 1.0
    assert out["memory/rank1/host_rss_growth_flag"] == 1.0
    assert out["memory/rank0/host_rss_growth_flag"] == 0.0
    assert out["memory/rank1/host_rss_growth_bytes_per_step"] == pytest.approx(4.1 * MiB)
    assert wd.message == "host RSS of rank 1 grew 4.1 MiB/step over the last 20 steps"


def test_gpu_memory_growth_is_watched_too() -> None:
    wd = MemoryWatchdog(SETTINGS)
    for step in range(30):
        wd.observe({"memory/rank0/gpu_allocated_bytes": 10e9 + 8 * MiB * step})
    assert wd.message == "GPU memory allocated of rank 0 grew 8.0 MiB/step over the last 20 steps"


def test_device_memory_growth_outside_torch_is_watched() -> None:
    """What grows on the card outside torch's allocator (NCCL buffers, CUDA graphs, vLLM's
    own mappings) leaves torch's figure flat: the card's own figure is watched beside it."""
    wd = MemoryWatchdog(SETTINGS)
    for step in range(30):
        wd.observe({"memory/rank1/gpu_allocated_bytes": 10e9,
                    "memory/rank1/gpu_device_used_bytes": 30e9 + 6 * MiB * step})
    assert wd.message == (
        "GPU memory used on the device of rank 1 grew 6.0 MiB/step over the last 20 steps"
    )


def test_per_process_keys_from_rank_results() -> None:
    per_rank = [
        {"memory/host_rss_bytes": 1.0, "actor/lr": 0.1},
        {"memory/host_rss_bytes": 2.0, "memory/gpu_peak_bytes": 3.0},
    ]
    assert per_process_memory(per_rank) == {
        "memory/rank0/host_rss_bytes": 1.0,
        "memory/rank1/host_rss_bytes": 2.0,
        "memory/rank1/gpu_peak_bytes": 3.0,
    }


def test_progress_status_clears_memory_growth_with_an_explicit_null() -> None:
    assert Progress(3, 10).to_status()["memoryGrowth"] is None
    msg = "host RSS of rank 1 grew 4.1 MiB/step over the last 20 steps"
    assert Progress(3, 10, memory_growth=msg).to_status()["memoryGrowth"] == msg


def test_leak_fault_spec() -> None:
    assert parse_fault("leak_host:4") == ("leak_host", 1)
    assert parse_fault("leak_host:4@step=6") == ("leak_host", 6)
    assert leak_mib_per_step("leak_host:4@step=6") == 4.0
    assert leak_mib_per_step("cuda_oom@step=2") == 0.0
    with pytest.raises(ConfigError):
        parse_fault("leak_host:lots")
    with pytest.raises(ConfigError):
        parse_fault("leak_host:0")


def test_prometheus_gets_one_gauge_per_kind_labelled_by_process() -> None:
    from prometheus_client import generate_latest

    logger = MetricsLogger(MetricsConfig(jsonl=False, prometheus_port=0), total_steps=2)
    logger.log(
        1,
        {
            "memory/host_rss_bytes": 7.0,
            "memory/rank0/host_rss_bytes": 5.0,
            "memory/rank1/host_rss_bytes": 7.0,
            "memory/rank1/host_rss_growth_flag": 1.0,
        },
    )
    text = generate_latest(logger._registry).decode()
    assert 'grpo_process_host_rss_bytes{process="rank1"} 7.0' in text
    assert 'grpo_process_host_rss_bytes{process="rank0"} 5.0' in text
    assert 'grpo_process_host_rss_growth_flag{process="rank1"} 1.0' in text
    assert "grpo_memory_host_rss_bytes 7.0" in text


def test_config_section() -> None:
    base = {"model": {"path": "m"}, "data": {"train_files": ["a.jsonl"]}}
    cfg = build_config(base, ["watchdog.threshold_mib_per_step=8"], environ={})
    assert cfg.watchdog.window_steps == 20 and cfg.watchdog.threshold_mib_per_step == 8
    with pytest.raises(ConfigError) as err:
        build_config(base, ["watchdog.window_steps=2"], environ={})
    assert err.value.field == "watchdog.window_steps"
