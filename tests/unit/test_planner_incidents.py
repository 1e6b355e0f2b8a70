"""The incidents in docs/incidents.md, as the planner must handle them."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_api.contract import FailureReason
from grpo_api.job import GRPOJobSpec, load_manifest, parse_spec
from grpo_operator.planner import InfeasibleError, next_safer_plan, plan_memory
from grpo_operator.planner.budget import BF16_B, GIB

pytestmark = pytest.mark.unit
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def example(name: str) -> GRPOJobSpec:
    return load_manifest(EXAMPLES / name).spec


# --- 1. 72B on 8 x 8 H100: every rank loading the whole model OOMed GPUs and host RAM.


def test_72b_gets_rank0_init_full_sharding_and_bounded_load_peak() -> None:
    plan = plan_memory(example("grpojob-qwen2vl-72b-h100.yaml"))
    assert plan.world_size == 64
    assert plan.settings.rank0_init
    full_copy = plan.geometry.shape.parameters * BF16_B / GIB  # ~137 GiB
    eight_copies = 8 * full_copy  # the incident: every rank of a node loaded the model
    # Rank 0 alone holds the checkpoint, in float32 as the trainer loads it (~301 GiB):
    # a third of the incident's load, and within a DGX H100 node's usable RAM.
    rank0_load = plan.budget.host_load_terms["rank0_full_model_fp32"]
    assert rank0_load == pytest.approx(1.1 * 4 * plan.geometry.shape.parameters / GIB)
    assert plan.budget.load_host_peak_gib < eight_copies / 3
    assert plan.budget.load_host_peak_gib < plan.budget.host_capacity_gib
    # Full sharding: per-GPU training state is 1/64 of fp32 params + grads + Adam.
    training = plan.budget.gpu_stages["training"]
    state = 16 * plan.geometry.shape.parameters / GIB / 64
    got = (
        training["fp32_master_params_shard"]
        + training["fp32_grads_shard"]
        + training["adam_moments_shard"]
    )
    assert got == pytest.approx(state, rel=0.01)
    # No GPU ever holds the whole model at load time.
    assert sum(plan.budget.gpu_stages["load"].values()) < full_copy / 8
    assert any(d.knob == "sharding" and d.value == "full over 64" for d in plan.decisions)
    assert plan.env["PYTORCH_CUDA_ALLOC_CONF"] == (
        "expandable_segments:True,pinned_max_round_threshold_mb:1,pinned_max_cached_size_mb:1")


def test_72b_with_rank0_init_pinned_off_reads_shards_and_no_gpu_holds_the_model() -> None:
    # rank0Init false is the trainer's sharded init: every rank reads only its own rows
    # of the safetensors files into its shards, so no GPU holds the whole model at load
    # (an H100 measured the load peak as the shards plus one tensor in flight).
    spec = example("grpojob-qwen2vl-72b-h100.yaml")
    spec = spec.model_copy(update={"memory": spec.memory.model_copy(update={"rank0_init": False})})
    plan = plan_memory(spec)
    full_copy = plan.geometry.shape.parameters * BF16_B / GIB
    load = plan.budget.gpu_stages["load"]
    assert sum(load.values()) < full_copy / 8
    assert load["largest_tensor_fp32"] == pytest.approx(
        plan.geometry.shape.vocab_size * plan.geometry.shape.hidden_size * 4 / GIB)
    assert not plan.settings.rank0_init  # rendered as actor.init_strategy "sharded"


# --- 2. 7B on 8 x A100-40GB, 760 GiB RAM: offload + Ray's object store exhausted host RAM.


def test_7b_a100_keeps_offload_off_and_counts_the_object_store() -> None:
    plan = plan_memory(example("grpojob-qwen25vl-7b-a100-40gb.yaml"))
    assert plan.geometry.host_memory_gib == 760
    assert not plan.settings.offload_params and not plan.settings.offload_optimizer
    host = plan.budget.host_terms
    assert host["ray_object_store"] > 0
    assert plan.budget.peak_host_gib < 0.95 * 0.95 * 760  # below Ray's kill line with margin
    # Sized for what a step moves, not Ray's default of 30% of RAM (228 GiB).
    assert plan.settings.ray_object_store_gib < 0.3 * 760 / 4
    assert plan.ray_start_params["object-store-memory"] == str(
        int(plan.settings.ray_object_store_gib * GIB)
    )
    assert plan.worker is not None and plan.worker.memory_gib <= 760


def test_7b_a100_incident_config_is_refused_when_host_cannot_take_it() -> None:
    """The incident's settings (both offloads + Ray's 30% default store) on a node whose
    RAM cannot hold them: refused with the host numbers, not planned into a kill."""
    doc = load_manifest(EXAMPLES / "grpojob-qwen25vl-7b-a100-40gb.yaml").spec.to_wire()
    doc["memory"] = {
        "offloadParams": True,
        "offloadOptimizer": True,
        "rayObjectStoreMemory": "228Gi",
    }
    doc["resources"]["hostMemory"] = "384Gi"
    with pytest.raises(InfeasibleError) as err:
        plan_memory(parse_spec(doc))
    text = str(err.value)
    assert "host peak" in text and "GiB usable" in text
    assert "ray_object_store 228.0 GiB" in text
    assert (
        "unset memory.offloadOptimizer, memory.offloadParams, memory.rayObjectStoreMemory" in text
    )


def test_offload_is_never_planned_into_missing_host_ram() -> None:
    doc = load_manifest(EXAMPLES / "grpojob-qwen25vl-7b-a100-40gb.yaml").spec.to_wire()
    doc["resources"].update({"gpusPerNode": 2, "hostMemory": "96Gi"})
    with pytest.raises(InfeasibleError) as err:
        plan_memory(parse_spec(doc))
    assert "host peak" in str(err.value)


# --- 3. 4 x H100 with 8 generations per prompt OOMed; cutting generations to 4 wasted GPUs.


def four_h100_eight_generations() -> GRPOJobSpec:
    return parse_spec(
        {
            "model": {"path": "Qwen/Qwen2.5-VL-7B-Instruct"},
            "data": {"train": "t", "maxPromptLength": 2048, "maxResponseLength": 2048},
            "algorithm": {"rolloutN": 8},
            "training": {"rolloutBatchSize": 128, "globalBatchSize": 128},
            "resources": {"gpuType": "H100-80GB", "nodes": 1, "gpusPerNode": 4},
            "checkpoint": {"size": "100Gi"},
        }
    )


def test_4xh100_turns_gradient_checkpointing_on_and_keeps_8_generations() -> None:
    plan = plan_memory(four_h100_eight_generations())
    assert plan.settings.gradient_checkpointing
    assert plan.settings.rollout_n == 8
    assert not plan.settings.offload_optimizer
    reason = next(d.reason for d in plan.decisions if d.knob == "gradientCheckpointing")
    assert "without it training peaks at" in reason


def test_4xh100_cuda_oom_ladder_never_cuts_generations() -> None:
    """The field note cut generations because that trainer generated with the policy
    model (KV cache per sequence). Here vLLM's KV cache is sized by its utilisation and
    the update's micro-batch by its budget (the micro-batch rung halves that): cutting
    rolloutN would change the algorithm for what other rungs give, and the ladder stops
    before it."""
    spec = four_h100_eight_generations()
    spec = spec.model_copy(
        update={"memory": spec.memory.model_copy(update={"gradient_checkpointing": None})}
    )
    plan = plan_memory(spec)
    rungs = []
    while (nxt := next_safer_plan(plan, FailureReason.CUDA_OOM)) is not None:
        rungs.append(nxt.rungs[-1])
        plan = nxt
    assert rungs[-1] == "offload params"
    assert plan.settings.rollout_n == 8
