"""Jobs that fit the nodes they ask for: gpusPerNode is checked against the catalog's
nodes at apply, and a worker asks for its share of the node (its GPUs over the node's)
of CPUs and host memory, so jobs that each use part of a node's GPUs share it."""

from __future__ import annotations

import math
from typing import Any

import pytest

from grpo_api.catalog import GPU_CATALOG
from grpo_api.contract import FailureReason
from grpo_api.job import parse_spec
from grpo_operator.catalog_file import merge_catalog
from grpo_operator.planner import InfeasibleError, Plan, next_safer_plan, plan_memory
from grpo_operator.planner.budget import SYSTEM_RESERVED_FRACTION
from grpo_operator.webhook import admission_problem

pytestmark = pytest.mark.unit


def job(gpu: str = "H100-80GB", nodes: int = 1, gpus: int | None = 4,
        model: str = "Qwen/Qwen2.5-VL-7B-Instruct") -> dict[str, Any]:
    resources: dict[str, Any] = {"gpuType": gpu, "nodes": nodes}
    if gpus is not None:
        resources["gpusPerNode"] = gpus
    return {
        "model": {"path": model},
        "data": {"train": "/data/t.parquet", "maxPromptLength": 1024, "maxResponseLength": 1024},
        "training": {"rolloutBatchSize": 64, "globalBatchSize": 64},
        "resources": resources,
        "checkpoint": {"size": "100Gi"},
    }


def plan(doc: dict[str, Any]) -> Plan:
    return plan_memory(parse_spec(doc))


def test_more_gpus_per_node_than_the_type_has_is_refused_naming_the_field_and_fix() -> None:
    problem = admission_problem(job(gpus=16), None)
    assert problem is not None
    assert "spec.resources.gpusPerNode: 16 is more than the 8 GPUs a H100-80GB node has" in problem
    assert "use resources.nodes: 2 with gpusPerNode: 8 for the same 16 GPUs" in problem


def test_the_charts_gpu_catalog_sets_the_gpus_per_node_checked() -> None:
    """gpuCatalog {H100-80GB: {gpusPerNode: 4}}: nodes of four H100s."""
    small_nodes = merge_catalog({"H100-80GB": {"gpusPerNode": 4}})
    assert admission_problem(job(gpus=8), None) is None
    refused = admission_problem(job(gpus=8), None, small_nodes)
    assert refused and "spec.resources.gpusPerNode: 8 is more than the 4 GPUs" in refused
    assert admission_problem(job(gpus=4), None, small_nodes) is None


def test_two_half_node_workers_fit_one_node_of_every_gpu_type() -> None:
    """A worker with half its node's GPUs asks for at most half of the node's CPUs and
    allocatable memory; with every GPU it keeps 90% of the CPUs."""
    for gpu in (g for g in GPU_CATALOG.values() if g.gpus_per_node >= 2):
        half = plan(job(gpu.name, gpus=gpu.gpus_per_node // 2,
                        model="Qwen/Qwen2.5-VL-3B-Instruct")).worker
        assert half is not None, gpu.name
        assert 2 * half.cpus <= gpu.cpus, (gpu.name, half.cpus)
        allocatable = gpu.host_memory_gib * (1 - SYSTEM_RESERVED_FRACTION)
        assert 2 * half.memory_gib <= allocatable, (gpu.name, half.memory_gib)
    whole = plan(job(gpus=None)).worker
    assert whole is not None and whole.cpus == int(GPU_CATALOG["H100-80GB"].cpus * 0.9)


def test_the_last_host_oom_rung_gives_the_worker_its_share_of_allocatable() -> None:
    """"pod memory to node allocatable" still raises the limit past the plan's need, to
    the worker's share of the node: four 4-GPU jobs that all took it still fit two
    8-GPU nodes."""
    p: Plan | None = plan(job())
    first = p
    while p is not None and "pod memory to node allocatable" not in p.rungs:
        p = next_safer_plan(p, FailureReason.HOST_OOM)
    assert p is not None and p.worker is not None and first.worker is not None
    share = GPU_CATALOG["H100-80GB"].host_memory_gib * (1 - SYSTEM_RESERVED_FRACTION) / 2
    assert p.worker.memory_gib == math.floor(share) > first.worker.memory_gib


def test_a_plan_needs_no_more_host_than_its_share_and_says_more_gpus_would_do() -> None:
    """72B on one of eight H100s: offloading everything would need far more than an
    eighth of the node's RAM, so the job is refused on the host, and the fix that
    gives it a bigger share (more GPUs per node) is named."""
    with pytest.raises(InfeasibleError) as err:
        plan(job(gpus=1, model="Qwen/Qwen2.5-VL-72B-Instruct"))
    assert any(s.startswith("resources.gpusPerNode: ") for s in err.value.suggestions)
    share = plan(job(gpus=4)).decisions
    host = next(d for d in share if d.knob == "hostMemory")
    assert "its share (4 of 8 GPUs) of the node's" in host.reason


def test_a_bigger_gpu_is_proposed_only_where_its_nodes_hold_the_jobs_gpus() -> None:
    """72B on 2 x 8 L4s: RTX 5090 nodes (4 GPUs) cannot hold 8 per worker."""
    with pytest.raises(InfeasibleError) as err:
        plan(job("L4-24GB", nodes=2, gpus=8, model="Qwen/Qwen2.5-VL-72B-Instruct"))
    proposed = [s.split()[1] for s in err.value.suggestions if s.startswith("resources.gpuType:")]
    assert proposed and all(GPU_CATALOG[g].gpus_per_node >= 8 for g in proposed), proposed
