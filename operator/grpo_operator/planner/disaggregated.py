"""spec.rollout.disaggregated as the planner's RolloutSide: the rollout GPU type as the
catalog in use has it, and the rollout nodes (the spec's, or the split's)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from grpo_api.catalog import GpuType, UnknownGpuType, gpu_type
from grpo_api.job import SpecError
from grpo_api.job.base import quantity_gib
from grpo_api.job.spec import GRPOJobSpec
from grpo_api.model.shape import Shape

from .rollout_side import RolloutSide
from .split import Split, StepWork, gpu_speed, splits, step_work
from .types import Budget, Decision, Geometry, InfeasibleError, PodResources

CPU_ENGINES_PER_NODE = 1  # a cpu rollout pod's engines when gpusPerNode is unset


def rollout_type(spec: GRPOJobSpec, catalog: Mapping[str, GpuType]) -> GpuType:
    """The rollout side's GPU type, or SpecError naming the field and the fix."""
    dis = spec.rollout.disaggregated
    assert dis is not None
    name = dis.gpu_type or spec.resources.gpu_type
    try:
        gpu = gpu_type(name, catalog)
    except UnknownGpuType as exc:
        raise SpecError([f"spec.rollout.disaggregated.gpuType: {exc}"]) from None
    if not gpu.is_gpu:  # a cpu job's side (the spec's split_problem kept the kinds apart)
        if spec.resources.gpu_type != gpu.name:
            raise SpecError(["spec.rollout.disaggregated.gpuType: cpu has no GPU for vLLM; "
                             "name a GPU type, or set rollout.placement colocated"])
        return gpu
    gpn = dis.gpus_per_node or gpu.gpus_per_node
    if gpn > gpu.gpus_per_node:
        raise SpecError([
            f"spec.rollout.disaggregated.gpusPerNode: {gpn} is more than the "
            f"{gpu.gpus_per_node} GPUs a {gpu.name} node has (a rollout pod runs on one "
            f"node); use {gpu.gpus_per_node} or fewer, with more disaggregated.nodes"])
    return gpu


def rollout_side(spec: GRPOJobSpec, catalog: Mapping[str, GpuType], nodes: int,
                 nodes_reason: str = "spec.rollout.disaggregated.nodes") -> RolloutSide:
    """The spec's rollout side on `nodes` nodes."""
    dis = spec.rollout.disaggregated
    assert dis is not None
    gpu = rollout_type(spec, catalog)
    same = gpu.name == spec.resources.gpu_type  # the job's nodes: the spec's overrides hold
    r = spec.resources
    return RolloutSide(
        gpu=gpu.name,
        gpu_memory_gib=gpu.memory_gib,
        product_label=gpu.product_label,
        nodes=nodes,
        gpus_per_node=dis.gpus_per_node or (
            CPU_ENGINES_PER_NODE if not gpu.is_gpu
            else r.gpus_per_node if same and r.gpus_per_node else gpu.gpus_per_node),
        node_gpus=gpu.gpus_per_node,
        host_memory_gib=(quantity_gib(r.host_memory) if same and r.host_memory
                         else gpu.host_memory_gib),
        cpus_per_node=(r.cpus_per_node if same and r.cpus_per_node else gpu.cpus),
        tensor_parallel=dis.tensor_parallel_size,
        max_staleness=spec.rollout.max_staleness,
        nodes_reason=nodes_reason,
    )


def spec_work(spec: GRPOJobSpec, shape: Shape) -> StepWork:
    """The spec's step as work: rollout batch x n x (prompt + response lengths)."""
    d = spec.data
    tokens = spec.training.rollout_batch_size * spec.algorithm.rollout_n * (
        d.max_prompt_length + d.max_response_length)
    return step_work(tokens, shape.parameters, d.max_response_length)


def proposed_splits(spec: GRPOJobSpec, catalog: Mapping[str, GpuType], shape: Shape,
                    gpus_per_node: int) -> list[Split]:
    """spec.resources.nodes split between the sides, fastest first (planner/split.py);
    the spec leaves disaggregated.nodes unset (its schema then requires nodes >= 2 and
    one GPU type)."""
    nodes = spec.resources.nodes
    assert nodes is not None and nodes >= 2
    speed = gpu_speed(catalog[spec.resources.gpu_type].bf16_tflops)
    return splits(nodes, gpus_per_node, spec_work(spec, shape),
                  spec.rollout.max_staleness >= 1, speed)


def choose_split(spec: GRPOJobSpec, catalog: Mapping[str, GpuType], shape: Shape,
                 gpu: GpuType, geometry: Callable[[int, int], Geometry],
                 fits: Callable[[Geometry], bool],
                 peaks: Callable[[Geometry], list[str]]) -> tuple[int, int, str]:
    """(training nodes, rollout nodes, why): the fastest split whose training side fits
    (core passes its geometry and fit test in, as mode_advice does, and `peaks`: what a
    refusal quotes of a training side that does not fit)."""
    gpn = spec.resources.gpus_per_node or gpu.gpus_per_node
    ranked = proposed_splits(spec, catalog, shape, gpn)
    overlap = spec.rollout.max_staleness >= 1
    work = spec_work(spec, shape)
    for i, split in enumerate(ranked):
        if fits(geometry(split.train_nodes, split.rollout_nodes)):
            why = split.reason(work, gpn, overlap)
            if i:
                best = ranked[0]
                ranks = best.train_nodes * gpn
                why += (f"; the faster {best.rollout_nodes}:{best.train_nodes} split leaves "
                        + (f"training.globalBatchSize {spec.training.global_batch_size} no "
                           f"whole share of its {ranks} ranks"
                           if spec.training.global_batch_size % ranks else
                           "the training side too few GPUs to fit"))
            return split.train_nodes, split.rollout_nodes, why
    nodes = spec.resources.nodes
    fastest = ([f"fastest split: {ranked[0].rollout_nodes} rollout, {ranked[0].train_nodes} "
                "training nodes; its training side:",
                *peaks(geometry(ranked[0].train_nodes, ranked[0].rollout_nodes))]
               if ranked else [])
    raise InfeasibleError(
        f"infeasible: no split of resources.nodes {nodes} between rollout and training "
        "leaves the training side enough GPUs to fit", fastest,
        ["raise resources.nodes", "set rollout.disaggregated.nodes (rollout nodes besides "
         "resources.nodes, which then all train)",
         "placement colocated, if one rollout GPU cannot hold the model: an engine apart "
         "runs vLLM at tensor parallel 1"])


def side_decisions(geo: Geometry, budget: Budget, pod: PodResources | None,
                   split_reason: str) -> list[Decision]:
    """status.plan.details' lines for the rollout side: where, how its GPU's memory
    goes, and (when the planner chose it) how the nodes were split."""
    side, rb = geo.rollout, budget.rollout_side
    if side is None or rb is None:
        return []
    where = split_reason or side.nodes_reason
    if not side.is_gpu:  # a cpu job: its engines' host memory is the whole story
        host = ", ".join(f"{k} {v:.1f} GiB" for k, v in rb.host_terms.items())
        return [Decision(
            "rollout side", f"{side.nodes} x {rb.engines_per_node} {geo.rollout_engine} "
            "engine(s) on cpu", "spec",
            f"{where}; maxStaleness {side.max_staleness}; host {host}"
            + (f"; pod {pod.memory_gib} GiB, {pod.cpus} CPUs" if pod else ""))]
    terms = ", ".join(f"{k} {v:.1f} GiB" for k, v in rb.terms.items())
    out = [
        Decision(
            "rollout side",
            f"{side.nodes} x {side.gpus_per_node} {side.gpu}",
            "auto" if split_reason else "spec",
            f"{where}; vLLM engines of TP {rb.tensor_parallel} (an engine apart is one "
            f"vLLM process, never a larger TP: docs/configuration.md), "
            f"{rb.engines_per_node} per node; maxStaleness {side.max_staleness}",
        ),
        Decision(
            "rollout GPU",
            f"{rb.peak_gpu_gib:.1f} GiB of {rb.gpu_capacity_gib:.1f} usable",
            "auto",
            f"{terms} (utilisation {rb.utilization:.2f} x {side.gpu_memory_gib:.1f} GiB); the "
            "training GPUs carry no vLLM term"
            + (f"; pod {pod.memory_gib} GiB, {pod.cpus} CPUs" if pod else ""),
        ),
    ]
    return out
