"""Remediation never makes things worse: a property over every failure class and a grid of
plans (GPU types, model sizes, node counts, pinned knobs, small and large hosts).

Each rung the ladder applies must leave every limit on the pods (memory, CPU, GPU,
/dev/shm) the same or higher, and raise the modelled headroom for the failure class
(none of its parts lower, one higher). A sample of plans is also rendered to show the
RayCluster's pods get exactly those limits.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from grpo_api.contract import FailureReason
from grpo_api.job import GRPOJobSpec, load_manifest, parse_spec, quantity_bytes
from grpo_operator.planner import InfeasibleError, Plan, next_safer_plan, plan_memory
from grpo_operator.planner.headroom import headroom
from grpo_operator.render import JobRef, render_children

pytestmark = pytest.mark.unit

JOB = JobRef("prop", "ns", "uid-1")
TINY_SHAPE = {
    "parameters": 215264,
    "visionParameters": 83616,
    "layers": 2,
    "hiddenSize": 64,
    "intermediateSize": 128,
    "attentionHeads": 4,
    "kvHeads": 2,
    "vocabSize": 448,
}
PINS: tuple[dict[str, Any], ...] = (
    {},
    {"offloadParams": True, "offloadOptimizer": True},
    {"gradientCheckpointing": False, "microBatchSize": 1},
    {"rolloutGpuMemoryUtilization": 0.5, "rayObjectStoreMemory": "64Gi"},
)


def gpu_specs() -> list[GRPOJobSpec]:
    out = []
    models = ("Qwen/Qwen2.5-VL-3B-Instruct", "Qwen/Qwen2.5-VL-7B-Instruct",
              "Qwen/Qwen2-VL-72B-Instruct")
    gpus = ("H100-80GB", "A100-40GB", "L40S-48GB")
    for model, gpu, nodes, host, pins in itertools.product(
        models, gpus, (1, 2, 8), (None, "384Gi"), PINS
    ):
        resources: dict[str, Any] = {"gpuType": gpu, "nodes": nodes}
        if host:
            resources["hostMemory"] = host
        out.append(
            {
                "model": {"path": model},
                "data": {"train": "t", "maxPromptLength": 1024, "maxResponseLength": 1024},
                "algorithm": {"rolloutN": 8},
                "training": {"rolloutBatchSize": 64, "globalBatchSize": 64},
                "resources": resources,
                "checkpoint": {"size": "100Gi"},
                "memory": pins,
            }
        )
    return [parse_spec(d) for d in out]


def cpu_specs() -> list[GRPOJobSpec]:
    out = []
    for host, workers, pins in itertools.product(
        ("8Gi", "12Gi", "16Gi", "64Gi"), (0, 2), PINS[:3]
    ):
        out.append(
            {
                "model": {"path": "/models/tiny", "shape": TINY_SHAPE},
                "data": {"train": "t", "maxPromptLength": 256, "maxResponseLength": 16,
                         "maxPixels": 12544, "workers": workers},
                "algorithm": {"rolloutN": 8},
                "training": {"rolloutBatchSize": 4, "globalBatchSize": 32},
                "resources": {"gpuType": "cpu", "nodes": 0, "gpusPerNode": 2, "cpusPerNode": 2,
                              "hostMemory": host},
                "checkpoint": {"size": "1Gi"},
                "memory": pins,
            }
        )
    return [parse_spec(d) for d in out]


def feasible_plans() -> list[tuple[GRPOJobSpec, Plan]]:
    out = []
    for spec in [*gpu_specs(), *cpu_specs()]:
        try:
            out.append((spec, plan_memory(spec)))
        except InfeasibleError:
            continue
    return out


PLANS = feasible_plans()


def rendered_limits(spec: GRPOJobSpec, plan: Plan) -> dict[str, float]:
    """Every limit on the rendered Ray pods, in GiB / cores / GPUs, by role.field."""
    rc = next(c for c in render_children(spec, plan, JOB, 0) if c["kind"] == "RayCluster")
    groups = [("head", rc["spec"]["headGroupSpec"])]
    groups += [("worker", g) for g in rc["spec"].get("workerGroupSpecs", [])]
    out: dict[str, float] = {}
    for role, g in groups:
        pod = g["template"]["spec"]
        limits = pod["containers"][0]["resources"]["limits"]
        shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
        out |= {
            f"{role}.memory": quantity_bytes(limits["memory"]) / 2**30,
            f"{role}.cpu": float(limits["cpu"]),
            f"{role}.gpu": float(limits.get("nvidia.com/gpu", 0)),
            f"{role}.shm": quantity_bytes(shm["emptyDir"]["sizeLimit"]) / 2**30,
        }
    return out


def pod_limits(plan: Plan) -> dict[str, float]:
    """The same from the plan (rendering is slow; the next test ties the two together)."""
    out: dict[str, float] = {}
    for p in (plan.head, plan.worker):
        if p is not None:
            out |= {f"{p.role}.memory": p.memory_gib, f"{p.role}.cpu": p.cpus,
                    f"{p.role}.gpu": p.gpus, f"{p.role}.shm": p.shm_gib}
    return out


def test_pods_get_the_limits_of_the_plan() -> None:
    for spec, plan in PLANS[::12]:
        for failure in (FailureReason.CUDA_OOM, FailureReason.HOST_OOM):
            nxt = next_safer_plan(plan, failure) or plan
            assert rendered_limits(spec, nxt) == pod_limits(nxt)


def test_the_grid_covers_every_kind_of_plan() -> None:
    """Guards the property below against a grid that silently became trivial."""
    assert len(PLANS) >= 100
    assert any(p.worker is None for _, p in PLANS)  # cpu: the head runs the ranks
    assert any(p.settings.offload_params for _, p in PLANS)
    assert any(not p.settings.gradient_checkpointing for _, p in PLANS)
    assert any(p.settings.pod_memory_at_allocatable is False and p.worker for _, p in PLANS)


@pytest.mark.parametrize("failure", list(FailureReason), ids=str)
def test_every_rung_keeps_limits_and_raises_headroom(failure: FailureReason) -> None:
    applied = 0
    for _, plan in PLANS:
        limits = pod_limits(plan)
        while (nxt := next_safer_plan(plan, failure)) is not None:
            applied += 1
            rung = nxt.rungs[-1]
            after = pod_limits(nxt)
            lowered = {k: (v, after[k]) for k, v in limits.items() if after[k] < v}
            assert not lowered, f"{failure} rung {rung!r} lowered {lowered}"
            old, new = headroom(plan, failure), headroom(nxt, failure)
            assert all(new[k] >= old[k] - 1e-6 for k in old), (rung, old, new)
            assert any(new[k] > old[k] + 1e-6 for k in old), (rung, old, new)
            plan, limits = nxt, after
    if failure in (FailureReason.CUDA_OOM, FailureReason.HOST_OOM, FailureReason.RAY_OOM):
        assert applied > 50, f"only {applied} {failure} rungs applied over the grid"
    else:
        assert applied == 0  # no memory ladder: restart with the same plan


def test_the_demo_head_never_loses_memory_and_a_no_op_rung_is_skipped() -> None:
    """`make demo`'s HostOOM used to lower the head from 12 GiB to 11 GiB: the default
    was rounded up past the node's allocatable, which the rung then rounded down."""
    tiny = load_manifest("examples/grpojob-tiny.yaml").spec
    plan = plan_memory(tiny)
    nxt = next_safer_plan(plan, FailureReason.HOST_OOM)
    assert nxt is not None and nxt.head.memory_gib > plan.head.memory_gib
    assert f"head.memoryGiB {plan.head.memory_gib} -> {nxt.head.memory_gib}" in (
        nxt.remediations[-1]
    )
    # On a node where the head already gets all of allocatable, that rung would change
    # nothing: it is skipped, and with no other rung left the ladder says so (None).
    at_cap = tiny.model_copy(
        update={"resources": tiny.resources.model_copy(update={"host_memory": "12Gi"})}
    )
    capped = plan_memory(at_cap)
    assert capped.head.memory_gib == 11  # floor(12 GiB x 0.95): never above allocatable
    assert next_safer_plan(capped, FailureReason.HOST_OOM) is None
