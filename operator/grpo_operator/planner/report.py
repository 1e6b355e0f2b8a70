"""Plan -> dict (JSON/YAML, status.plan) and Plan -> rich tables for `grpo plan`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from rich.console import Group
from rich.table import Table

from grpo_api.contract import RANK0_GROUP
from grpo_api.job.status import PlanStatus
from grpo_api.knobs import KNOBS

from .budget import ESTIMATES
from .network import plan_network
from .peaks import planned_peaks
from .save_time import predicted_save_s, termination_grace_s
from .types import Plan, PodResources


def _round(d: dict[str, float]) -> dict[str, float]:
    return {k: round(v, 2) for k, v in d.items()}


def _pod(p: PodResources | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {
        "role": p.role,
        "replicas": p.replicas,
        "gpus": p.gpus,
        "cpus": p.cpus,
        "memoryGiB": p.memory_gib,
        "shmGiB": p.shm_gib,
        "nodeSelector": dict(p.node_selector),
        "tolerations": [dict(t) for t in p.tolerations],
        "devices": dict(p.devices),
        "capabilities": list(p.capabilities),
    }


def _rollout(plan: Plan) -> dict[str, Any] | None:
    """A disaggregated job's rollout side, as status.plan.rollout has it (camelCase)."""
    side, rb = plan.geometry.rollout, plan.budget.rollout_side
    if side is None or rb is None:
        return None
    return {
        "gpu": side.gpu,
        "nodes": side.nodes,
        "gpusPerNode": side.gpus_per_node,
        "tensorParallelSize": rb.tensor_parallel,
        "enginesPerNode": rb.engines_per_node,
        "gpuMemoryUtilization": rb.utilization,
        "kvCacheGiB": round(rb.kv_cache_gib, 2),
        "peakGpuGiB": round(rb.peak_gpu_gib, 2),
        "maxStaleness": side.max_staleness,
    }


def _knobs(plan: Plan) -> dict[str, Any]:
    """The planned knobs status.plan reports, by the names users write (grpo_api.knobs)."""
    return {k.spec: plan.knob_value(k) for k in KNOBS if k.in_status}


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    g, s, b = plan.geometry, plan.settings, plan.budget
    return {
        "model": {
            "path": g.model_path,
            "parameters": g.shape.parameters,
            "visionParameters": g.shape.vision_parameters,
            "layers": g.shape.layers,
            "hiddenSize": g.shape.hidden_size,
            "source": g.shape_source,
            **({"loraRank": g.lora.rank, "adapterParameters": g.lora.adapter_parameters}
               if g.lora is not None else {}),
        },
        "cluster": {
            "gpu": g.gpu,
            "nodes": g.nodes,
            "gpusPerNode": g.gpus_per_node,
            "worldSize": g.world_size,
            "hostMemoryGiB": g.host_memory_gib,
        },
        "settings": {
            "mode": g.mode(s),
            **_knobs(plan),
            "rayObjectStoreGiB": s.ray_object_store_gib,
            "podMemoryAtAllocatable": s.pod_memory_at_allocatable,
        },
        "memory": {
            "gpuCapacityGiB": round(b.gpu_capacity_gib, 2),
            "gpuMarginGiB": round(b.gpu_margin_gib, 2),
            "peakGpuGiB": round(b.peak_gpu_gib, 2),
            "peakGpuStage": b.peak_gpu_stage,
            "gpuStagesGiB": {k: _round(v) for k, v in b.gpu_stages.items()},
            "hostCapacityGiB": round(b.host_capacity_gib, 2),
            "hostMarginGiB": round(b.host_margin_gib, 2),
            "peakHostGiB": round(b.peak_host_gib, 2),
            "peakHostOtherGiB": round(b.peak_host_other_gib, 2),  # a node not rank 0's
            "hostSteadyGiB": _round(b.host_terms),
            "hostLoadGiB": _round(b.host_load_terms),
            # What the trainer's readings are held to (status.plan.peaks, MemoryPlan).
            "peaks": planned_peaks(plan).to_wire(),
            "estimatedTerms": sorted(ESTIMATES),
        },
        **({"rollout": _rollout(plan)} if g.rollout is not None else {}),
        "pods": {"head": _pod(plan.head), "worker": _pod(plan.worker),
                 **({RANK0_GROUP: _pod(plan.rank0)} if plan.rank0 else {}),
                 **({"rollout": _pod(plan.rollout)} if plan.rollout else {})},
        "podTotals": pod_totals(plan),
        # The head's and workers' terminationGracePeriodSeconds, for the save on SIGTERM.
        "sigterm": {"predictedSaveSeconds": round(predicted_save_s(plan), 1),
                    "terminationGraceSeconds": termination_grace_s(plan)},
        "env": dict(plan.env),
        "rayStartParams": dict(plan.ray_start_params),
        "headRayStartParams": plan.head_ray_start_params,
        **({"rolloutRayStartParams": dict(plan.rollout_ray_start_params)}
           if plan.rollout else {}),
        "decisions": [asdict(d) for d in plan.decisions],
        "remediations": list(plan.remediations),
    }


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flat(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


# What a restart can change and a user should be told of: the planned settings, the
# cluster's shape (rollout TP among it), every pod limit, the env and Ray's start params.
_COMPARED = ("cluster", "settings", "pods", "env", "rayStartParams")


def plan_changes(old: Plan, new: Plan) -> list[str]:
    """Every user-visible difference between two plans, as "name old -> new"."""
    a, b = plan_to_dict(old), plan_to_dict(new)
    before = _flat({k: a[k] for k in _COMPARED})
    after = _flat({k: b[k] for k in _COMPARED})
    return [f"{k} {before.get(k, '-')} -> {after.get(k, '-')}"
            for k in sorted(before.keys() | after.keys()) if before.get(k) != after.get(k)]


def pod_totals(plan: Plan) -> dict[str, int]:
    """What the attempt's pods request in all: what a platform team pays for."""
    pods = plan.all_pods
    return {"pods": sum(p.replicas for p in pods),
            "gpus": sum(p.replicas * p.gpus for p in pods),
            "cpus": sum(p.replicas * p.cpus for p in pods),
            "memoryGiB": sum(p.replicas * p.memory_gib for p in pods)}


def plan_status(plan: Plan, measured_save_s: float | None = None,
                inherited: Mapping[str, str] | None = None) -> PlanStatus:
    """The typed summary for status.plan; the full dict goes under `details`.
    `measured_save_s`: status.progress.saveSeconds, which sizes the grace period;
    `inherited`: the spec fields the platform's defaults set, and where from."""
    g, b = plan.geometry, plan.budget
    return PlanStatus.model_validate(
        {
            "gpu": g.gpu,
            "nodes": g.nodes,
            "gpusPerNode": g.gpus_per_node,
            "totalGpus": g.world_size,
            **_knobs(plan),
            "mode": g.mode(plan.settings),
            "rolloutEngine": g.rollout_engine,
            "placement": "disaggregated" if g.rollout is not None else "colocated",
            **({"rollout": _rollout(plan)} if g.rollout is not None else {}),
            "fabrics": list(plan_network(g).fabrics),
            "modelSource": g.shape_source,
            "nodeSource": g.node_source,
            "peakGpuGiB": round(b.peak_gpu_gib, 2),
            "peakHostGiB": round(b.peak_host_gib, 2),
            "peaks": planned_peaks(plan).to_wire(),
            "predictedSaveSeconds": round(predicted_save_s(plan), 1),
            "terminationGraceSeconds": termination_grace_s(plan, measured_save_s),
            **({"inherited": dict(inherited)} if inherited else {}),
            "details": {
                "decisions": [
                    f"{d.knob}={d.value} ({d.source}): {d.reason}" for d in plan.decisions
                ],
                "remediations": list(plan.remediations),
            },
        },
        by_alias=True,
        by_name=False,
    )


def plan_tables(plan: Plan, title: str = "") -> Group:
    g, b = plan.geometry, plan.budget
    head = Table(title=title or f"Plan: {g.model_path}", title_justify="left", expand=False)
    for col in ("Decision", "Value", "Source", "Why"):
        head.add_column(col, overflow="fold")
    for d in plan.decisions:
        head.add_row(d.knob, d.value, d.source, d.reason)
    mem = Table(
        title="Predicted memory (GiB): Total stays within Usable minus Margin; "
        "~ marks an estimate, every other term counts tensors",
        title_justify="left",
    )
    mem.add_column("Where")
    mem.add_column("Total", justify="right")
    mem.add_column("Usable", justify="right")
    mem.add_column("Margin", justify="right")
    mem.add_column("Terms", overflow="fold")
    rows = [(f"GPU {stage}", terms, b.gpu_capacity_gib, b.gpu_margin_gib)
            for stage, terms in b.gpu_stages.items()]
    if b.rollout_side is not None and b.rollout_side.terms:  # GPU stages above train only
        rb = b.rollout_side
        rows.append((f"rollout GPU {rb.gpu}", rb.terms, rb.gpu_capacity_gib,
                     rb.gpu_margin_gib))
    host_usable = b.host_capacity_gib + b.host_margin_gib
    rows += [("host steady", b.host_terms, host_usable, b.host_margin_gib),
             ("host load", b.host_load_terms, host_usable, b.host_margin_gib)]
    if b.rollout_side is not None:  # a rollout node's host (its margin is in Usable)
        rows.append(("rollout host", b.rollout_side.host_terms,
                     b.rollout_side.host_capacity_gib, 0.0))
    for where, terms, usable, margin in rows:
        mem.add_row(
            where,
            f"{sum(terms.values()):.1f}",
            f"{usable:.1f}",
            f"{margin:.1f}",
            ", ".join(f"{k} {'~' if k in ESTIMATES else ''}{v:.1f}"
                      for k, v in terms.items() if v),
        )
    grace = termination_grace_s(plan)
    pods = Table(title=f"Pods: SIGTERM grace {grace} s (terminationGracePeriodSeconds) for a "
                 f"checkpoint save predicted at ~{predicted_save_s(plan):.0f} s; the measured "
                 "save sizes it from the next attempt on", title_justify="left")
    for col in ("Role", "Replicas", "GPU", "CPU", "Memory", "/dev/shm", "nodeSelector",
                "Devices"):
        pods.add_column(col, overflow="fold")
    for p in plan.all_pods:
        pods.add_row(
            p.role,
            str(p.replicas),
            str(p.gpus),
            str(p.cpus),
            f"{p.memory_gib}Gi",
            f"{p.shm_gib}Gi",
            ", ".join(f"{k}={v}" for k, v in p.node_selector.items()) or "-",
            ", ".join(f"{k}: {v}" for k, v in p.devices.items()) or "-",
        )
    total = pod_totals(plan)
    pods.add_row("total (all pods)", str(total["pods"]), str(total["gpus"]),
                 str(total["cpus"]), f"{total['memoryGiB']}Gi", "-", "-", "-")
    env = Table(title="Env", title_justify="left")
    env.add_column("Name", overflow="fold")
    env.add_column("Value", overflow="fold")
    for k, v in plan.env.items():
        env.add_row(k, v)
    return Group(head, mem, pods, env)
