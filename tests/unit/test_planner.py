"""The planner on its own: model shapes, sizing, pods, env, refusals, and a sweep."""

from __future__ import annotations

import json
import re
from itertools import product
from pathlib import Path
from typing import Any

import pytest

from grpo_api.catalog import GPU_CATALOG, GPU_PRODUCT_LABEL
from grpo_api.job import load_manifest, parse_spec
from grpo_api.model_config import shape_fields
from grpo_operator.plan_model import HubAccess, read_model
from grpo_operator.planner import (
    KNOWN_MODELS,
    InfeasibleError,
    plan_memory,
    plan_status,
    plan_to_dict,
    shape_from_config,
)

pytestmark = pytest.mark.unit
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("grpojob-*.yaml"))

QWEN25_VL_7B_FLAT = {  # transformers < 4.50 layout: LM fields at the top level
    "model_type": "qwen2_5_vl",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
    "vision_config": {
        "depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
        "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2, "hidden_act": "silu",
    },
}  # fmt: skip
QWEN2_VL_72B = {
    "model_type": "qwen2_vl",
    "hidden_size": 8192,
    "intermediate_size": 29568,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 152064,
    "vision_config": {"depth": 32, "embed_dim": 1280, "mlp_ratio": 4, "num_heads": 16,
                      "hidden_size": 8192, "patch_size": 14, "spatial_merge_size": 2},
}  # fmt: skip
QWEN3_VL_8B_NESTED = {  # newer layout: the LM under text_config
    "model_type": "qwen3_vl",
    "text_config": {
        "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 36,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 151936, "tie_word_embeddings": False,
    },
    "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                      "out_hidden_size": 4096, "patch_size": 16, "spatial_merge_size": 2},
}  # fmt: skip


@pytest.mark.parametrize(
    ("config", "billions", "layers"),
    [(QWEN25_VL_7B_FLAT, 8.29, 28), (QWEN2_VL_72B, 73.4, 80), (QWEN3_VL_8B_NESTED, 8.77, 36)],
)
def test_config_json_layouts(config: dict[str, Any], billions: float, layers: int) -> None:
    shape = shape_from_config(config)
    assert shape.parameters / 1e9 == pytest.approx(billions, rel=0.03)
    assert shape.layers == layers
    assert 0.3e9 < shape.vision_parameters < 0.8e9


def test_config_json_missing_fields_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="lacks hidden_size"):
        shape_from_config({"model_type": "qwen3_vl", "text_config": {"num_hidden_layers": 2}})


def test_config_json_is_read_from_a_local_model_dir(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(QWEN3_VL_8B_NESTED))
    offline = HubAccess(offline=True)
    local = read_model({"model": {"path": str(tmp_path / "m")}}, None, offline)
    assert local.config == shape_fields(QWEN3_VL_8B_NESTED)
    assert read_model({"model": {"path": "/m"}}, tmp_path, offline).config == local.config
    hub = read_model({"model": {"path": "Qwen/Qwen2.5-VL-7B-Instruct"}}, None, offline)
    assert hub.config is None and "(--offline)" in str(hub.source)


def doc(model: str = "Qwen/Qwen2.5-VL-7B-Instruct", **resources: Any) -> dict[str, Any]:
    return {
        "model": {"path": model},
        "data": {"train": "t"},
        "resources": {"gpuType": "H100-80GB", **resources},
        "checkpoint": {"size": "100Gi"},
    }


def test_config_json_wins_over_the_name() -> None:
    plan = plan_memory(parse_spec(doc("/models/custom", nodes=1)), model_config=QWEN2_VL_72B)
    assert plan.geometry.shape.layers == 80
    assert "config.json" in plan.geometry.shape_source


@pytest.mark.parametrize("path", ["Qwen/Qwen2-VL-7B-Instruct", "/models/qwen3-vl-32b-instruct"])
def test_known_families_by_name(path: str) -> None:
    plan = plan_memory(parse_spec(doc(path)))
    assert plan.geometry.shape_source.startswith("known table")


def test_unknown_model_without_shape_says_how_to_fix() -> None:
    with pytest.raises(ValueError, match=r"set spec.model.shape"):
        plan_memory(parse_spec(doc("someone/llava-13b", nodes=1)))


def test_nodes_are_derived_when_unset() -> None:
    small = plan_memory(parse_spec(doc()))
    big = plan_memory(parse_spec(doc("Qwen/Qwen2.5-VL-72B-Instruct")))
    assert small.geometry.nodes == 1
    assert big.geometry.nodes > 1
    assert not (big.settings.offload_params or big.settings.offload_optimizer)
    assert any(d.knob == "cluster" and "fewest nodes" in d.reason for d in big.decisions)


@pytest.mark.parametrize(
    ("model", "gpu", "nodes", "gpus", "fix"),
    [
        ("Qwen/Qwen2.5-VL-72B-Instruct", "H100-80GB", 1, 1, "resources.gpusPerNode:"),
        ("Qwen/Qwen3-VL-235B-A22B-Instruct", "H100-80GB", 1, 8, "resources.nodes:"),
        ("Qwen/Qwen2.5-VL-7B-Instruct", "L4-24GB", 1, 1, "resources.gpuType: L40S-48GB"),
    ],
)
def test_infeasible_job_gets_numbers_and_the_smallest_changes(
    model: str, gpu: str, nodes: int, gpus: int, fix: str
) -> None:
    d = doc(model, nodes=nodes, gpusPerNode=gpus)
    d["resources"]["gpuType"] = gpu
    with pytest.raises(InfeasibleError) as err:
        plan_memory(parse_spec(d))
    text = str(err.value)
    assert "does not fit" in text and "GiB" in text
    assert fix in text
    assert "a smaller model:" in text


def test_global_batch_must_split_over_ranks() -> None:
    d = doc(nodes=3)
    with pytest.raises(InfeasibleError, match="not a multiple of the world size 24"):
        plan_memory(parse_spec(d))


def test_gpu_pods_select_and_tolerate_the_gpu_type() -> None:
    plan = plan_memory(parse_spec(doc(nodes=2)))
    assert plan.worker is not None and plan.rank0 is not None  # rank 0's node apart
    assert plan.worker.replicas + plan.rank0.replicas == 2
    for pod, need in ((plan.worker, plan.budget.peak_host_other_gib),
                      (plan.rank0, plan.budget.peak_host_gib)):
        assert pod.gpus == 8
        assert pod.node_selector == {GPU_PRODUCT_LABEL: "NVIDIA-H100-80GB-HBM3"}
        assert pod.tolerations[0]["key"] == "nvidia.com/gpu"
        assert pod.shm_gib >= plan.settings.ray_object_store_gib
        assert pod.memory_gib >= need
    assert plan.head.gpus == 0 and not plan.head.node_selector


def test_env_holds_what_processes_read_and_no_planned_setting() -> None:
    plan = plan_memory(parse_spec(doc(nodes=1)))
    # The planned settings travel in the trainer config only (grpo_api.knobs).
    assert not [name for name in plan.env if name.startswith("GRPO_")], plan.env
    assert plan.env["RAY_memory_usage_threshold"] == "0.95"
    assert plan.env["TOKENIZERS_PARALLELISM"] == "false"
    assert plan.env["NCCL_DEBUG"] == "WARN"


def test_tiny_cpu_job_has_no_workers_and_no_gpu_settings() -> None:
    plan = plan_memory(load_manifest(EXAMPLES[-1]).spec)
    assert plan.geometry.gpu == "cpu"
    assert plan.worker is None
    assert plan.head.gpus == 0
    assert "PYTORCH_CUDA_ALLOC_CONF" not in plan.env
    assert plan.budget.peak_host_gib <= plan.head.memory_gib


def test_pinned_knobs_are_respected_and_reported_as_spec() -> None:
    d = doc(nodes=1)
    d["memory"] = {"microBatchSize": 1, "rolloutGpuMemoryUtilization": 0.5}
    plan = plan_memory(parse_spec(d))
    assert plan.settings.micro_batch_size == 1
    assert plan.settings.rollout_gpu_memory_utilization == 0.5
    sources = {d.knob: d.source for d in plan.decisions}
    assert sources["microBatchSize"] == "spec" and sources["gradientCheckpointing"] == "auto"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_plans_and_serialises(path: Path) -> None:
    plan = plan_memory(load_manifest(path).spec)
    d = plan_to_dict(plan)
    json.dumps(d)
    assert d["decisions"] and all(x["reason"] for x in d["decisions"])
    status = plan_status(plan).to_wire()
    assert status["totalGpus"] == plan.world_size


SIZES = sorted(KNOWN_MODELS)


@pytest.mark.parametrize("gpu", [g for g in GPU_CATALOG if g != "cpu"])
def test_sweep_never_crashes(gpu: str) -> None:
    """Every valid spec (at most the type's GPUs per node) gets a plan or an
    InfeasibleError; never anything else. Responses of 512 tokens: at the default length a
    12 GB card fits no model (the update's logits alone are ~8.7 GiB for a 2048-token
    response over Qwen's 152k vocabulary)."""
    outcomes = {"planned": 0, "refused": 0}
    per_node = [g for g in (1, 2, 4, 8) if g <= GPU_CATALOG[gpu].gpus_per_node]
    for model, nodes, gpn in product(SIZES, (1, 2, 4, 8), per_node):
        d = doc(f"Qwen/{model}", nodes=nodes, gpusPerNode=gpn)
        d["resources"]["gpuType"] = gpu
        d["training"] = {"globalBatchSize": 64, "rolloutBatchSize": 64}
        d["data"]["maxResponseLength"] = 512
        try:
            plan = plan_memory(parse_spec(d))
        except InfeasibleError as exc:
            assert exc.numbers or "not a multiple" in exc.summary
            outcomes["refused"] += 1
            continue
        assert plan.budget.fits
        outcomes["planned"] += 1
    assert outcomes["planned"] > 0 and outcomes["refused"] > 0


def test_pods_are_explained() -> None:
    plan = plan_memory(parse_spec(doc(nodes=2)))
    by_knob = {d.knob: d for d in plan.decisions}
    # Rank 0's node reads the whole model: a pod of its own; the other worker asks less.
    assert by_knob["rank0Pod"].value.startswith("1 x (8 GPU")
    assert by_knob["workerPods"].value.startswith("1 x (8 GPU")
    assert "rank 0 reads the whole model" in by_knob["rank0Pod"].reason
    assert "NVIDIA-H100-80GB-HBM3" in by_knob["workerPods"].reason
    assert "headPod" in by_knob



@pytest.mark.parametrize("rollout_n", [4, 16])
def test_object_store_is_sized_for_the_jobs_own_rollout_n(rollout_n: int) -> None:
    """The store holds a step's data, which grows with generations per prompt: the
    size and the reason shown come from the same rolloutN."""
    d = doc(nodes=1) | {"algorithm": {"rolloutN": rollout_n},
                        "data": {"train": "t", "maxPromptLength": 8192,
                                 "maxResponseLength": 8192}}
    plan = plan_memory(parse_spec(d))
    reason = next(x for x in plan.decisions if x.knob == "rayObjectStoreMemory")
    step = float(re.search(r"a step moves ~([\d.]+) GiB", reason.reason).group(1))  # type: ignore[union-attr]
    assert plan.settings.ray_object_store_gib == pytest.approx(4 * step, abs=0.25)
    assert reason.value == f"{plan.settings.ray_object_store_gib:.1f} GiB"
    assert plan.ray_start_params["object-store-memory"] == str(
        int(plan.settings.ray_object_store_gib * 2**30))
    # 4 x (512 prompts x n x 16384 tokens x 24 B + 512 images x 1003520 px x 3 B)
    tokens, images = 512 * rollout_n * 16384 * 24, 512 * 1003520 * 3
    assert plan.settings.ray_object_store_gib == round(4 * (tokens + images) / 2**30, 1)
