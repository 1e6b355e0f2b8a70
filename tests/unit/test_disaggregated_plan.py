"""spec.rollout.placement disaggregated: the spec's refusals, the plan of both sides
(numbers checked against hand arithmetic), and the split the planner proposes."""

from __future__ import annotations

import copy
import math
from typing import Any

import pytest
from rich.console import Console

from grpo_api.job import SpecError, parse_spec
from grpo_operator.planner import InfeasibleError, plan_memory
from grpo_operator.planner.budget import GIB
from grpo_operator.planner.report import plan_status, plan_tables
from grpo_operator.planner.split import FILL, GENERATION_SHARE, splits, step_work
from grpo_operator.planner.stage_terms import compute_budget
from grpo_operator.webhook import admission_problem
from grpo_testbed.examples import example_job

pytestmark = pytest.mark.unit

H100_7B = example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"]  # 1 x 8 H100, 7B VLM
L40S_SIDE = {"placement": "disaggregated", "disaggregated": {"gpuType": "L40S-48GB",
                                                              "nodes": 1}}


def spec_with(rollout: dict[str, Any], **resources: Any) -> dict[str, Any]:
    spec = copy.deepcopy(H100_7B)
    spec["rollout"] = rollout
    spec["resources"] = {**spec["resources"], **resources}
    return spec


def test_a_7b_vlm_plans_8_h100_training_and_8_l40s_rollout_gpus() -> None:
    """The rollout GPU holds vLLM alone: 0.90 of an L40S (45.0 GiB; the most that keeps
    the 4% margin: (45.0 x 0.95 - 1.71) / 45.0 = 0.912), the 8.29B model's bf16 weights
    at TP 1 (8.29e9 x 2 B = 15.44 GiB, under 60% of 40.5), 2 GiB of activations and
    graphs, and the rest, 40.5 - 15.44 - 2.0 = 23.06 GiB, KV cache."""
    plan = plan_memory(parse_spec(spec_with(L40S_SIDE)))
    rb = plan.budget.rollout_side
    assert rb is not None
    weights = 8.29e9 * 2 / GIB
    assert rb.terms["vllm_weights"] == pytest.approx(weights) == pytest.approx(15.44, abs=0.01)
    assert rb.utilization == 0.90
    assert rb.tensor_parallel == 1 and rb.engines_per_node == 8
    assert rb.kv_cache_gib == pytest.approx(0.9 * 45.0 - weights - 2.0)
    assert rb.peak_gpu_gib == pytest.approx(40.5)
    assert rb.gpu_capacity_gib == pytest.approx(45.0 * 0.95)
    assert not plan.budget.problems()
    # The pods: 1 x 8 H100 train, 1 x 8 L40S generate, each on its own GPU type's nodes.
    assert plan.worker is not None and plan.rollout is not None
    assert (plan.worker.replicas, plan.worker.gpus) == (1, 8)
    assert (plan.rollout.replicas, plan.rollout.gpus, plan.rollout.role) == (1, 8, "rollout")
    assert plan.rollout.node_selector == {"nvidia.com/gpu.product": "NVIDIA-L40S"}
    assert plan.worker.node_selector == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    # status.plan shows both sides.
    status = plan_status(plan).to_wire()
    assert status["placement"] == "disaggregated" and status["totalGpus"] == 8
    assert status["rollout"] == {
        "gpu": "L40S-48GB", "nodes": 1, "gpusPerNode": 8, "tensorParallelSize": 1,
        "enginesPerNode": 8, "gpuMemoryUtilization": 0.9,
        "kvCacheGiB": round(rb.kv_cache_gib, 2), "peakGpuGiB": 40.5, "maxStaleness": 1}
    assert any(d.knob == "rollout side" and d.value == "1 x 8 L40S-48GB"
               for d in plan.decisions)


def test_the_training_gpus_carry_no_vllm_term() -> None:
    """Same settings, same 8 H100: the colocated plan's rollout phase (the actor's
    residency beside vLLM's share), the engine's weights in the sync and vLLM's sleep-mode
    copies in host RAM are gone; every other term is the same."""
    colocated = plan_memory(parse_spec(H100_7B))
    dis = plan_memory(parse_spec(spec_with(L40S_SIDE)))
    st = colocated.settings
    c = compute_budget(colocated.geometry, st)
    d = compute_budget(dis.geometry, st)
    assert "rollout" in c.gpu_stages and "rollout" not in d.gpu_stages
    vllm_share = st.rollout_gpu_memory_utilization * 79.6
    assert sum(v for k, v in c.gpu_stages["rollout"].items()
               if k.startswith("vllm")) == pytest.approx(vllm_share)
    for phase in ("load", "training", "training_root", "optimizer_step"):
        assert d.gpu_stages[phase] == c.gpu_stages[phase]
    sync = dict(c.gpu_stages["weight_sync"])
    del sync["vllm_weights"]
    assert d.gpu_stages["weight_sync"] == sync
    assert c.host_terms["vllm_sleep_cuda_graphs"] == 8 * 1.0
    assert d.host_terms["vllm_sleep_cuda_graphs"] == 0.0
    assert {k: v for k, v in d.host_terms.items() if not k.startswith("vllm")} == {
        k: v for k, v in c.host_terms.items() if not k.startswith("vllm")}
    # Colocated the peak is the rollout phase (vLLM fills what the actor leaves); the
    # training side's is smaller by vLLM's share less the phases' difference.
    assert c.peak_gpu_stage == "rollout"
    assert d.peak_gpu_gib < c.peak_gpu_gib - 10


@pytest.mark.parametrize(("rollout", "resources", "found"), [
    ({"placement": "disaggregated"}, {},
     "rollout.disaggregated: required with placement disaggregated"),
    ({"disaggregated": {"nodes": 1}}, {},
     "rollout.disaggregated: set but placement is colocated"),
    ({"placement": "disaggregated", "disaggregated": {"gpusPerNode": 8,
                                                      "tensorParallelSize": 2}}, {"nodes": 2},
     "rollout.disaggregated.tensorParallelSize: 2; a rollout engine apart (placement "
     "disaggregated) runs vLLM at tensor parallel 1"),
    ({"placement": "disaggregated", "engine": "hf", "disaggregated": {"nodes": 1}}, {},
     "rollout.engine: hf with placement disaggregated"),
    ({"placement": "disaggregated", "disaggregated": {"gpuType": "L40S-48GB"}}, {"nodes": 2},
     "rollout.disaggregated.nodes: required when gpuType (L40S-48GB) is not resources.gpuType"),
    ({"placement": "disaggregated", "disaggregated": {}}, {"nodes": 1},
     "needs resources.nodes >= 2"),
])
def test_inconsistent_rollout_specs_are_refused_naming_the_field(
        rollout: dict[str, Any], resources: dict[str, Any], found: str) -> None:
    with pytest.raises(SpecError, match="rollout") as err:
        parse_spec(spec_with(rollout, **resources))
    assert found in str(err.value)
    assert found in (admission_problem(spec_with(rollout, **resources), None) or "")


def test_an_unknown_rollout_gpu_type_is_refused_with_the_known_ones() -> None:
    spec = spec_with({"placement": "disaggregated",
                      "disaggregated": {"gpuType": "TPU-v9", "nodes": 1}})
    with pytest.raises(SpecError) as err:
        plan_memory(parse_spec(spec))
    assert "spec.rollout.disaggregated.gpuType: unknown GPU type 'TPU-v9'" in str(err.value)
    assert "L40S-48GB" in str(err.value)
    problem = admission_problem(spec, None) or ""
    assert "spec.rollout.disaggregated.gpuType" in problem
    too_many = spec_with({"placement": "disaggregated",
                          "disaggregated": {"gpuType": "RTX5090-32GB", "gpusPerNode": 8,
                                            "nodes": 1}})
    assert "disaggregated.gpusPerNode: 8 is more than the 4 GPUs" in (
        admission_problem(too_many, None) or "")


def test_the_split_balances_generation_against_the_update_by_hand() -> None:
    """4 x 8 H100, the reference step (512 x 5 x (2048 + 2048) tokens, the 7B): 504
    GPU-s of generation's parallel part (180 s x 50% x 70% x 8 GPUs) and a 27 s tail,
    702.72 GPU-s of update (180 x 48.8% x 8), a 2.16 s sync. 2 rollout nodes: max(504/16
    + 27, 702.72/16) + 2.16 = 60.66 s; colocated 504/32 + 27 + 702.72/32 + 2.16 = 66.87."""
    spec = parse_spec(spec_with({"placement": "disaggregated", "disaggregated": {}}, nodes=4))
    plan = plan_memory(spec)
    assert plan.geometry.nodes == 2 and plan.geometry.rollout is not None
    assert plan.geometry.rollout.nodes == 2 and plan.world_size == 16
    side = next(d for d in plan.decisions if d.knob == "rollout side")
    assert side.source == "auto" and "2 of 4 nodes generate" in side.reason
    work = step_work(512 * 5 * 4096, 8.29e9, 2048)
    assert (work.generation_gpu_s, work.tail_s) == (pytest.approx(504), pytest.approx(27))
    assert (work.update_gpu_s, work.sync_s) == (pytest.approx(702.72), pytest.approx(2.16))
    best, *rest = splits(4, 8, work, overlap=True)
    assert (best.rollout_nodes, best.train_nodes) == (2, 2)
    assert best.step_s == pytest.approx(60.66)
    assert best.colocated_step_s == pytest.approx(66.87, abs=0.01)
    assert [s.rollout_nodes for s in rest] == [3, 1]  # 90.0 s, then 92.16 s
    # The reference itself: 8 GPUs colocated take the published 180 s.
    assert work.colocated_s(8) == pytest.approx(180)
    assert GENERATION_SHARE == 0.5 and 0.16 < FILL < 0.17
    # Synchronous (maxStaleness 0): the sides take turns, and colocated is faster.
    sync_best = splits(4, 8, work, overlap=False)[0]
    assert sync_best.step_s > sync_best.colocated_step_s


def test_a_rollout_gpu_that_cannot_hold_the_model_is_never_given_a_larger_tp() -> None:
    """The 72B (bf16 weights ~137 GiB) on 3 x 8 A100-40GB: an engine apart is one vLLM
    process at tensor parallel 1 (grpo_api.trainer_config.ENGINE_APART_TENSOR_PARALLEL), so
    no split fits, where the planner once sharded each engine over 4 GPUs; the refusal
    names the limit and placement colocated as the way out."""
    spec = spec_with({"placement": "disaggregated", "disaggregated": {}}, nodes=3,
                     gpuType="A100-40GB")
    spec["model"] = {"path": "Qwen/Qwen2.5-VL-72B-Instruct"}
    with pytest.raises(InfeasibleError) as err:
        plan_memory(parse_spec(spec))
    assert "placement colocated, if one rollout GPU cannot hold the model: an engine apart " \
           "runs vLLM at tensor parallel 1" in str(err.value)
    # The same model on B200s, which hold it whole: planned, at TP 1, one engine a GPU.
    spec["resources"] = {**spec["resources"], "gpuType": "B200-180GB"}
    plan = plan_memory(parse_spec(spec))
    rb = plan.budget.rollout_side
    assert rb is not None and plan.geometry.rollout is not None
    assert (rb.tensor_parallel, rb.engines_per_node) == (1, plan.geometry.rollout.gpus_per_node)
    reason = next(d for d in plan.decisions if d.knob == "rollout side").reason
    assert "vLLM engines of TP 1 (an engine apart is one vLLM process" in reason


def test_a_split_whose_ranks_do_not_divide_the_batch_is_passed_over() -> None:
    """8 x 8 H100: 5 rollout nodes would be fastest (max(504/40 + 27, 702.72/24) + 2.16 =
    41.76 s), but 24 training ranks cannot share globalBatchSize 128 evenly; 4:4 (44.94 s)
    runs, and the reason says why."""
    plan = plan_memory(parse_spec(spec_with(
        {"placement": "disaggregated", "disaggregated": {}}, nodes=8)))
    assert plan.geometry.rollout is not None
    assert (plan.geometry.rollout.nodes, plan.geometry.nodes) == (4, 4)
    reason = next(d for d in plan.decisions if d.knob == "rollout side").reason
    assert "the faster 5:3 split leaves training.globalBatchSize 128 no whole share of its " \
           "24 ranks" in reason
    best = splits(8, 8, step_work(512 * 5 * 4096, 8.29e9, 2048), overlap=True)[0]
    assert (best.rollout_nodes, best.step_s) == (5, pytest.approx(41.76))


def test_grpo_plan_prints_both_sides_and_the_rollout_nodes_host_is_budgeted() -> None:
    """The rollout pod's memory comes from its node's budget: 8 engines x 3 GiB, one
    15.44 GiB host copy of the weights while they load, the object store; /0.9 headroom."""
    plan = plan_memory(parse_spec(spec_with(L40S_SIDE)))
    rb = plan.budget.rollout_side
    assert rb is not None and plan.rollout is not None
    store = plan.settings.ray_object_store_gib
    assert rb.host_terms == {"rollout_engine_processes": 24.0,
                             "vllm_weights_load": pytest.approx(15.44, abs=0.01),
                             "ray_object_store": store}
    assert plan.rollout.memory_gib == math.ceil(max(rb.peak_host_gib / 0.9,
                                                    rb.peak_host_gib + 4))
    console = Console(width=200, record=True)
    console.print(plan_tables(plan))
    text = console.export_text()
    assert "rollout GPU L40S-48GB" in text and "rollout host" in text
    assert "no vLLM on these GPUs (disaggregated)" in text  # the offload reasons
    assert "vllm_activations_and_cuda_graphs ~2.0" in text  # an estimate, marked
    assert "rollout side" in text and "1 x 8 L40S-48GB" in text
    rollout_pod = next(line for line in text.splitlines()
                       if [c.strip() for c in line.split("│")][1:2] == ["rollout"])
    assert "nvidia.com/gpu.product=NVIDIA-L40S" in rollout_pod
    assert f"{plan.rollout.memory_gib}Gi" in rollout_pod


def test_unset_training_nodes_are_derived_beside_the_rollout_sides() -> None:
    spec = spec_with(L40S_SIDE)
    del spec["resources"]["nodes"]
    plan = plan_memory(parse_spec(spec))
    assert plan.geometry.nodes == 1 and plan.geometry.rollout is not None
    assert plan.geometry.rollout.nodes == 1
    cluster = next(d for d in plan.decisions if d.knob == "cluster")
    assert cluster.reason.startswith("fewest nodes whose plan fits without offload (1)")


def test_no_split_that_fits_is_refused_with_the_fix() -> None:
    """72B on 2 x 8 A100-40GB: 1 node cannot hold its training state; the only split
    leaves the update 1 node, so the job is refused naming both fields to raise."""
    spec = spec_with({"placement": "disaggregated", "disaggregated": {}}, nodes=2,
                     gpuType="A100-40GB")
    spec["model"] = {"path": "Qwen/Qwen2.5-VL-72B-Instruct"}
    with pytest.raises(InfeasibleError) as err:
        plan_memory(parse_spec(spec))
    text = str(err.value)
    assert "no split of resources.nodes 2 between rollout and training" in text
    assert "raise resources.nodes" in text and "rollout.disaggregated.nodes" in text
