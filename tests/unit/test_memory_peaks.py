"""Planned and measured memory peaks in one shape (grpo_api.job.memory_peaks): the
planner's figures, the driver's maxima, the card's reading, and what passes what."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_api.job import load_manifest, parse_spec
from grpo_api.job.memory_peaks import MeasuredPeaks, MemoryPeaks, compared, overruns
from grpo_operator.planner import plan_memory
from grpo_operator.planner.peaks import NOT_A_RANK, planned_peaks
from grpo_operator.planner.report import plan_status
from grpo_operator.render import JobRef
from grpo_operator.render.trainer_config import trainer_config
from grpo_testbed.examples import example_job
from grpo_trainer.config import build_config
from grpo_trainer.config import planned_peaks as config_planned_peaks
from grpo_trainer.config_error import ConfigError
from grpo_trainer.driver.measured_peaks import PeakTracker
from grpo_trainer.rank.gpu_memory import StepGpuMemory, card_peaks, gpu_memory_metrics

pytestmark = pytest.mark.unit
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GiB = 2**30


def test_the_plan_promises_each_rank_stage_its_largest_gpu_stage_and_a_ranks_host_share(
) -> None:
    plan = plan_memory(load_manifest(EXAMPLES / "grpojob-qwen25vl-7b-h100.yaml").spec)
    b = plan.budget
    peaks = planned_peaks(plan)
    total = {name: sum(t.values()) for name, t in b.gpu_stages.items()}
    assert peaks.gpu_gib == {
        "rollout": pytest.approx(max(total["rollout"], total["weight_sync"]), abs=0.01),
        "training": pytest.approx(max(total["training"], total["training_root"],
                                      total["optimizer_step"]), abs=0.01)}
    assert peaks.gpu_gib["rollout"] == pytest.approx(b.peak_gpu_gib, abs=0.01)
    ranks = sum(v for k, v in b.host_terms.items() if k not in NOT_A_RANK)
    assert peaks.host_rank_gib == pytest.approx(ranks / 8, abs=0.01)
    assert peaks.driver_gib is None  # the driver is on the CPU head, not a worker node
    assert plan_status(plan).peaks == peaks  # what status.plan.peaks carries


def test_a_cpu_job_is_promised_host_memory_only_and_its_driver() -> None:
    plan = plan_memory(load_manifest(EXAMPLES / "grpojob-tiny.yaml").spec)
    peaks = planned_peaks(plan)
    assert peaks.gpu_gib == {}
    assert peaks.driver_gib == pytest.approx(plan.budget.host_terms["driver"], abs=0.01)
    assert 0 < peaks.host_rank_gib < plan.budget.peak_host_gib  # type: ignore[operator]


def test_overruns_name_each_figure_past_the_plan_and_by_how_much() -> None:
    planned = MemoryPeaks.model_validate({"gpuGiB": {"rollout": 70.0, "training": 50.0},
                                          "hostRankGiB": 4.0})
    measured = MeasuredPeaks.model_validate({"gpuGiB": {"rollout": 72.5, "training": 49.0},
                                             "hostRankGiB": 5.0, "driverGiB": 9.0,
                                             "attempt": 1, "step": 7})
    over = overruns(planned, measured)
    assert [o.what for o in over] == ["GPU rollout", "host per rank"]  # driver: not planned
    assert str(over[0]) == "GPU rollout: measured 72.50 GiB, planned 70.00 GiB, 2.50 GiB " \
        "over (+4%)"
    assert f"{over[1]:.1f}" == "host per rank: measured 5.0 GiB, planned 4.0 GiB, 1.0 GiB " \
        "over (+25%)"
    assert compared(planned, measured) == ["GPU rollout 72.50/70.00", "GPU training 49.00/50.00",
                                           "host per rank 5.00/4.00"]
    equal = MeasuredPeaks.model_validate({"gpuGiB": {"rollout": 70.0}})
    assert overruns(planned, equal) == []  # equal: within


def test_the_tracker_keeps_this_attempts_maxima_over_steps() -> None:
    t = PeakTracker(attempt=2)
    assert t.peaks is None and t.to_status() is None  # nothing measured: nothing reported
    t.observe(1, {"memory/host_rss_bytes": 3 * GiB, "memory/driver/host_rss_bytes": GiB,
                  "memory/gpu_rollout_card_peak_bytes": 60 * GiB,
                  "memory/gpu_training_card_peak_bytes": 40 * GiB})
    t.observe(2, {"memory/host_rss_bytes": 2 * GiB, "memory/driver/host_rss_bytes": 2 * GiB,
                  "memory/gpu_rollout_card_peak_bytes": 59 * GiB,
                  "memory/gpu_training_card_peak_bytes": 41 * GiB})
    t.observe(3, {"reward/mean": 0.5})  # a step without readings leaves the step mark
    assert t.to_status() == {"gpuGiB": {"rollout": 60.0, "training": 41.0},
                             "hostRankGiB": 3.0, "driverGiB": 2.0, "attempt": 2, "step": 2}
    cpu = PeakTracker(attempt=0)
    cpu.observe(1, {"memory/host_rss_bytes": 1.5 * GiB})
    assert cpu.to_status() == {"gpuGiB": {}, "hostRankGiB": 1.5, "attempt": 0, "step": 1}


def test_the_cards_peak_adds_what_it_holds_outside_torch() -> None:
    """Beside torch's peak: the card's bytes outside torch's pools at that moment (CUDA
    context, NCCL, cuBLAS), as the plan's stages count a cuda_context term. The pool vLLM
    unmapped by its sleep is torch's (reserved) but not on the card."""
    m = StepGpuMemory(allocated=57 * GiB, reserved=87 * GiB, update_peak=85 * GiB,
                      rollout_peak=55 * GiB, asleep=45 * GiB, device_used=44 * GiB,
                      rollout_device_used=60 * GiB, asleep_device_used=14 * GiB,
                      rollout_reserved=58 * GiB)
    rollout, training = card_peaks(m)
    assert rollout == 55 * GiB + 2 * GiB  # 60 on the card, 58 of it torch's
    assert training == 40 * GiB + 2 * GiB  # 44 on the card, 87 - 45 = 42 of it torch's
    metrics = gpu_memory_metrics(m)
    assert metrics["memory/gpu_rollout_card_peak_bytes"] == rollout
    assert metrics["memory/gpu_training_card_peak_bytes"] == training


def test_the_trainer_is_handed_its_plans_peaks_and_exports_them_beside_its_readings(
) -> None:
    """The rendered config carries status.plan.peaks; the driver's metrics name each
    planned figure after the reading it stands beside (the dashboard's measured vs
    planned), and the trainer refuses a config whose peaks do not read."""
    spec = parse_spec(example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"])
    plan = plan_memory(spec)
    cfg = build_config(trainer_config(spec, plan, JobRef("j", "ns", "uid")))
    assert config_planned_peaks(cfg) == planned_peaks(plan)
    t = PeakTracker(0, config_planned_peaks(cfg))
    p = planned_peaks(plan)
    assert t.planned_metrics() == {
        "plan/gpu_rollout_peak_bytes": pytest.approx(p.gpu_gib["rollout"] * GiB),
        "plan/gpu_training_peak_bytes": pytest.approx(p.gpu_gib["training"] * GiB),
        "plan/host_rank_peak_bytes": pytest.approx(p.host_rank_gib * GiB)}  # type: ignore[operator]
    assert PeakTracker(0).planned_metrics() == {}  # grpo-train run alone: no plan
    bad = trainer_config(spec, plan, JobRef("j", "ns", "uid"))
    bad["metrics"]["planned_peaks"] = {"gpuGiB": {"rollout": "a lot"}}
    with pytest.raises(ConfigError, match=r"metrics\.planned_peaks\.gpuGiB"):
        build_config(bad)
