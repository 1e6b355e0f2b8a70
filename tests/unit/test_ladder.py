"""Remediation ladders after an OOM: order, one rung per restart, exhaustion, guards."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from grpo_api.contract import FailureReason, RankStage
from grpo_api.job import GRPOJobSpec, parse_spec
from grpo_operator.planner import (
    Plan,
    next_safer_plan,
    plan_memory,
    plan_status,
    remediation_ladder,
)
from grpo_operator.planner.core import replan
from grpo_operator.render.names import JobRef
from grpo_operator.render.trainer_config import trainer_config

pytestmark = pytest.mark.unit
JOB = JobRef("j", "ns", "uid")


def spec(rollout_batch: int = 64, allow_bf16: bool = False, lora: bool = False,
         **memory: Any) -> GRPOJobSpec:
    # Short sequences, 3B model: fits with gradient checkpointing off, so the ladder has
    # every CudaOOM rung available.
    return parse_spec(
        {
            "recovery": {"allowPrecisionChange": allow_bf16},
            **({"lora": {}} if lora else {}),
            "model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"},
            "data": {"train": "t", "maxPromptLength": 512, "maxResponseLength": 256},
            "algorithm": {"rolloutN": 8},
            "training": {"rolloutBatchSize": rollout_batch, "globalBatchSize": 64},
            "resources": {"gpuType": "H100-80GB", "nodes": 1, "gpusPerNode": 4},
            "checkpoint": {"size": "50Gi"},
            "memory": memory,
        }
    )


def walk(plan: Plan, failure: FailureReason) -> list[Plan]:
    out = []
    while (nxt := next_safer_plan(plan, failure)) is not None:
        out.append(nxt)
        plan = nxt
    return out


def test_ladder_names_follow_the_design() -> None:
    assert remediation_ladder(FailureReason.CUDA_OOM) == (
        "gradient checkpointing on",
        "halve micro-batch",
        "lower rollout GPU memory utilisation",
        "bf16 training",
        "offload optimizer",
        "offload params",
    )
    assert remediation_ladder("HostOOM") == remediation_ladder(FailureReason.RAY_OOM)
    assert remediation_ladder(FailureReason.NODE_LOST) == ()


def test_cuda_oom_turns_checkpointing_on_first_and_keeps_generations() -> None:
    plan = plan_memory(spec())
    assert not plan.settings.gradient_checkpointing  # it fits without
    first = next_safer_plan(plan, FailureReason.CUDA_OOM)
    assert first is not None
    assert first.settings.gradient_checkpointing
    assert first.settings.rollout_n == 8
    config = trainer_config(spec(), first, JOB)  # the next attempt's ConfigMap
    assert config["actor"]["gradient_checkpointing"] is True
    assert first.remediations[-1].startswith("CudaOOM: gradient checkpointing on:")
    assert "predicted GPU" in first.remediations[-1]


def test_cuda_oom_walks_the_whole_ladder_once_then_stops() -> None:
    plans = walk(plan_memory(spec(allow_bf16=True)), FailureReason.CUDA_OOM)
    assert [p.rungs[-1] for p in plans] == list(remediation_ladder(FailureReason.CUDA_OOM))
    first, last = plans[0].settings, plans[-1].settings
    assert last.offload_optimizer and last.offload_params
    assert 0 < last.micro_batch_tokens < first.micro_batch_tokens  # halved by tokens
    assert last.rollout_n == 8  # the algorithm is the user's: never a remediation
    assert len(plans[-1].remediations) == 6


def test_precision_never_changes_unless_the_spec_allows_it() -> None:
    """allowPrecisionChange is off by default: every rung but bf16 is walked, and every
    attempt trains in mixed precision as the spec says."""
    plans = walk(plan_memory(spec()), FailureReason.CUDA_OOM)
    assert "bf16 training" not in [p.rungs[-1] for p in plans]
    assert len(plans) == 5 and plans[-1].settings.offload_params
    for p in plans:
        assert p.settings.precision == "mixed"
        assert trainer_config(spec(), p, JOB)["actor"]["precision"] == "mixed"
        assert plan_status(p).mode == "mixed"


def test_allowed_precision_change_is_bf16_before_any_offload() -> None:
    plans = walk(plan_memory(spec(allow_bf16=True)), FailureReason.CUDA_OOM)
    rungs = [p.rungs[-1] for p in plans]
    switched = plans[rungs.index("bf16 training")]
    before = plans[rungs.index("bf16 training") - 1]
    assert not (switched.settings.offload_optimizer or switched.settings.offload_params)
    assert switched.settings.precision == "bf16" and plan_status(switched).mode == "bf16"
    assert trainer_config(spec(allow_bf16=True), switched, JOB)["actor"]["precision"] == "bf16"
    assert switched.budget.peak_gpu_gib < before.budget.peak_gpu_gib
    assert "settings.precision mixed -> bf16" in switched.remediations[-1]
    # Once switched, every later attempt stays in bf16.
    assert all(p.settings.precision == "bf16" for p in plans[rungs.index("bf16 training"):])


def test_a_lora_job_is_never_switched_to_bf16() -> None:
    plans = walk(plan_memory(spec(allow_bf16=True, lora=True)), FailureReason.CUDA_OOM)
    assert plans and "bf16 training" not in [p.rungs[-1] for p in plans]
    assert all(plan_status(p).mode == "lora" for p in plans)


def test_spec_pinned_knobs_are_left_alone() -> None:
    plans = walk(plan_memory(spec(gradientCheckpointing=False)), FailureReason.CUDA_OOM)
    assert all(not p.settings.gradient_checkpointing for p in plans)
    assert "gradient checkpointing on" not in [p.rungs[-1] for p in plans]


def test_host_oom_turns_offload_off_then_shrinks_store_then_raises_pod_memory() -> None:
    plan = plan_memory(spec(512, offloadParams=True, offloadOptimizer=True))
    # The spec pinned both offloads, so the host ladder starts at the object store.
    assert plan.settings.ray_object_store_gib > 2
    plans = walk(plan, FailureReason.HOST_OOM)
    assert [p.rungs[-1] for p in plans] == [
        "smaller Ray object store",
        "pod memory to node allocatable",
    ]
    assert plans[0].settings.ray_object_store_gib < plan.settings.ray_object_store_gib
    assert plans[-1].worker is not None and plan.worker is not None
    assert plans[-1].worker.memory_gib > plan.worker.memory_gib


def test_host_oom_after_cuda_remediation_undoes_offload() -> None:
    plan = plan_memory(spec())
    for _ in range(5):  # gc, micro-batch, util, offload optimizer, offload params (no bf16)
        nxt = next_safer_plan(plan, FailureReason.CUDA_OOM)
        assert nxt is not None
        plan = nxt
    assert plan.settings.offload_params
    after = next_safer_plan(plan, FailureReason.RAY_OOM)
    assert after is not None
    assert not after.settings.offload_params
    assert trainer_config(spec(), after, JOB)["actor"]["offload_params"] is False


def test_accepts_a_spec_and_returns_none_for_non_memory_failures() -> None:
    assert next_safer_plan(spec(), FailureReason.CUDA_OOM) is not None
    assert next_safer_plan(spec(), FailureReason.ERROR) is None


def test_the_remediation_note_names_every_setting_the_rung_moved_rollout_tp_too() -> None:
    """Lowering vLLM's memory share of the 72B job doubles its rollout TP: the note on
    the attempt must say so, not only the knob the rung turned."""
    import yaml

    from grpo_operator.reconcile.planning import planned

    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "examples"
                          / "grpojob-qwen2vl-72b-h100.yaml").read_text())
    # On 16 nodes each GPU keeps half the actor state of the example's 8, so vLLM gets
    # 0.80 of the card and TP 4 (34 GiB slices) leaves it 40% for the KV cache; 0.70 no
    # longer does.
    doc["spec"]["resources"]["nodes"] = 16
    plan: Plan | None = planned(parse_spec(doc["spec"]))
    while plan is not None and "lower rollout GPU memory utilisation" not in plan.rungs:
        plan = next_safer_plan(plan, "CudaOOM")
    assert plan is not None
    note = plan.remediations[-1]
    assert "settings.rolloutGpuMemoryUtilization" in note
    assert "settings.rolloutTensorParallel 4 -> 8" in note


def test_a_rollout_oom_lowers_vllms_utilisation_before_anything_that_helps_only_the_update(
) -> None:
    """vLLM ran out (its start-up check, its wake-up, its KV cache): gradient
    checkpointing and a smaller micro-batch relieve only the update, so they are skipped;
    the same OOM in the update still turns checkpointing on first."""
    plan = plan_memory(spec())
    rollout = next_safer_plan(plan, FailureReason.CUDA_OOM, stage=RankStage.ROLLOUT)
    assert rollout is not None
    assert "lower rollout GPU memory utilisation" in rollout.remediations[-1]
    assert (rollout.settings.rollout_gpu_memory_utilization
            < plan.settings.rollout_gpu_memory_utilization)
    training = next_safer_plan(plan, FailureReason.CUDA_OOM, stage="training")
    assert training is not None and "gradient checkpointing on" in training.remediations[-1]
    unknown = next_safer_plan(plan, FailureReason.CUDA_OOM)
    assert unknown is not None and unknown.settings == training.settings
    steps = []
    while (nxt := next_safer_plan(plan, FailureReason.CUDA_OOM, stage=RankStage.ROLLOUT)):
        steps.append(nxt.remediations[-1])
        plan = nxt
    assert steps and not any("gradient checkpointing" in s or "micro-batch" in s for s in steps)


def _kv_walk(plan: Plan) -> list[Plan]:
    out = []
    while (nxt := next_safer_plan(plan, FailureReason.CUDA_OOM, stage=RankStage.KV_CACHE)):
        out.append(nxt)
        plan = nxt
    return out


def test_a_kv_cache_shortage_gives_vllm_more_of_the_gpu_never_less() -> None:
    """vLLM's engine start found too little left for its KV cache (its wordings classify
    as rank phase kv_cache). The rollout OOM's remedy, a lower utilisation, would shrink
    the cache further: this ladder raises the utilisation to what the update's residency
    leaves (the planner chose that already, so here the first rung has nothing to add),
    then offloads the optimizer and the parameters to free more, each plan within the
    margin and each with more KV cache per GPU than the one before."""
    plan = plan_memory(spec())
    assert remediation_ladder(FailureReason.CUDA_OOM, "kv_cache") == (
        "raise rollout GPU memory utilisation", "offload optimizer for the KV cache",
        "offload params for the KV cache")
    steps = _kv_walk(plan)
    assert [s.rungs[-1] for s in steps] == [
        "offload optimizer for the KV cache", "offload params for the KV cache"]
    before = plan
    for step in steps:
        assert step.budget.fits, step.budget.problems()
        assert (step.settings.rollout_gpu_memory_utilization
                > before.settings.rollout_gpu_memory_utilization)
        assert step.budget.rollout_kv_cache_gib > before.budget.rollout_kv_cache_gib
        before = step
    # The same job's rollout OOM goes the other way.
    rollout = next_safer_plan(plan, FailureReason.CUDA_OOM, stage=RankStage.ROLLOUT)
    assert rollout is not None and (rollout.settings.rollout_gpu_memory_utilization
                                    < plan.settings.rollout_gpu_memory_utilization)


def test_a_kv_cache_shortage_under_a_utilisation_below_the_most_raises_it() -> None:
    """The user set a low utilisation in an earlier spec (not pinned now: a plan whose
    utilisation a rollout OOM lowered skips the raise, below): raised to the most."""
    plan = plan_memory(spec())
    low = replan(plan, replace(plan.settings, rollout_gpu_memory_utilization=0.4), "")
    raised = next_safer_plan(low, FailureReason.CUDA_OOM, stage=RankStage.KV_CACHE)
    assert raised is not None and raised.rungs[-1] == "raise rollout GPU memory utilisation"
    assert raised.settings.rollout_gpu_memory_utilization == pytest.approx(
        plan.settings.rollout_gpu_memory_utilization)
    # After a rollout OOM lowered it, the modelled most already ran out: offload instead.
    lowered = next_safer_plan(plan, FailureReason.CUDA_OOM, stage=RankStage.ROLLOUT)
    assert lowered is not None
    nxt = next_safer_plan(lowered, FailureReason.CUDA_OOM, stage=RankStage.KV_CACHE)
    assert nxt is not None and nxt.rungs[-1] == "offload optimizer for the KV cache"


def test_a_kv_cache_shortage_under_a_pinned_utilisation_has_no_rung() -> None:
    """Every rung of the KV ladder moves the utilisation: pinned, the ladder is empty and
    the job ends with the failure (the message says every safer setting was tried)."""
    plan = plan_memory(spec(rolloutGpuMemoryUtilization=0.5))
    assert next_safer_plan(plan, FailureReason.CUDA_OOM, stage=RankStage.KV_CACHE) is None
