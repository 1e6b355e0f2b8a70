"""Headroom: every plan the planner chooses keeps a stated margin under the usable GPU
memory and the node's allocatable memory; knobs a spec pins are kept, and the plan says
when they leave less (docs/memory-model.md, "Margin")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from grpo_api.catalog import GPU_CATALOG
from grpo_api.job import load_manifest, parse_spec
from grpo_api.model.shape import KNOWN_MODELS
from grpo_operator.cli import cli
from grpo_operator.planner import InfeasibleError, Plan, plan_memory
from grpo_operator.planner.budget import GPU_MARGIN_MIN_GIB, host_capacity_gib

pytestmark = pytest.mark.unit
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("grpojob-*.yaml"))
H100_7B = Path(__file__).resolve().parents[2] / "examples" / "grpojob-qwen25vl-7b-h100.yaml"


def _keeps_the_margin(plan: Plan) -> list[str]:
    """Every GPU phase within usable minus the margin, the host within allocatable minus
    its margin; the problems, if any."""
    b, geo = plan.budget, plan.geometry
    out = []
    if geo.is_gpu:
        assert b.gpu_margin_gib >= GPU_MARGIN_MIN_GIB
        for phase, terms in b.gpu_stages.items():
            if sum(terms.values()) > b.gpu_capacity_gib - b.gpu_margin_gib:
                out.append(f"GPU {phase} {sum(terms.values()):.2f} GiB > "
                           f"{b.gpu_capacity_gib:.2f} - {b.gpu_margin_gib:.2f}")
    allocatable = host_capacity_gib(geo, at_allocatable=True)
    assert b.host_margin_gib > 0
    assert b.host_capacity_gib + b.host_margin_gib == pytest.approx(allocatable)
    if b.peak_host_gib > allocatable - b.host_margin_gib:
        out.append(f"host {b.peak_host_gib:.2f} GiB > {allocatable:.2f} - {b.host_margin_gib:.2f}")
    return out


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_no_example_plans_into_the_margin(path: Path) -> None:
    plan = plan_memory(load_manifest(path).spec)
    assert not _keeps_the_margin(plan)
    assert plan.budget.fits


def test_the_7b_example_leaves_the_margin_free_in_rollout() -> None:
    """It planned vLLM's share up to 75.5 of 75.6 usable GiB; now the margin stays."""
    b = plan_memory(load_manifest(H100_7B).spec).budget
    rollout = sum(b.gpu_stages["rollout"].values())
    assert b.gpu_capacity_gib - rollout >= b.gpu_margin_gib == pytest.approx(3.0, abs=0.1)


def _job(model: str, gpu: str, nodes: int) -> dict[str, Any]:
    return {
        "model": {"path": model},
        "data": {"train": "hiyouga/geometry3k@train", "maxPromptLength": 2048,
                 "maxResponseLength": 2048},
        "algorithm": {"rolloutN": 5, "klCoef": 0.01},
        "training": {"rolloutBatchSize": 512, "globalBatchSize": 128},
        "resources": {"gpuType": gpu, "nodes": nodes},
        "checkpoint": {"size": "1Ti"},
    }


@pytest.mark.parametrize("gpu", ["A100-40GB", "H100-80GB", "L4-24GB"])
def test_no_chosen_plan_uses_the_margin(gpu: str) -> None:
    """Every known model on 1, 2 and 4 nodes of the type: what the planner chooses
    (nothing pinned) keeps the margin, or it refuses."""
    planned = 0
    for name in KNOWN_MODELS:
        for nodes in (1, 2, 4):
            try:
                plan = plan_memory(parse_spec(_job(name, gpu, nodes)))
            except InfeasibleError:
                continue
            planned += 1
            assert not _keeps_the_margin(plan), (name, nodes)
    assert planned > 10


def _pinned_into_the_margin() -> dict[str, Any]:
    """The 7B example with vLLM's share pinned so that rollout ends 1 GiB short of the
    usable memory (inside the 3 GiB margin, but it fits), and offload pinned off (which
    the planner would otherwise turn on to make room)."""
    doc = yaml.safe_load(H100_7B.read_text())["spec"]
    auto = plan_memory(parse_spec(doc)).budget
    rollout = auto.gpu_stages["rollout"]
    others = sum(v for k, v in rollout.items() if not k.startswith("vllm"))
    util = (auto.gpu_capacity_gib - 1.0 - others) / GPU_CATALOG["H100-80GB"].memory_gib
    return {**doc, "memory": {"rolloutGpuMemoryUtilization": round(util, 2),
                              "offloadOptimizer": False, "offloadParams": False}}


def test_a_pinned_knob_that_leaves_less_is_kept_and_the_plan_says_so() -> None:
    plan = plan_memory(parse_spec(_pinned_into_the_margin()))
    b = plan.budget
    assert b.fits_without_margin and not b.fits
    assert b.gpu_margin_left_gib < b.gpu_margin_gib
    note = next(d for d in plan.decisions if d.knob == "gpuMargin")
    assert note.source == "spec"
    assert "LESS THAN THE 3.0 GiB MARGIN" in note.reason
    assert "memory.rolloutGpuMemoryUtilization" in note.reason


def test_an_auto_plan_states_its_margin() -> None:
    plan = plan_memory(load_manifest(H100_7B).spec)
    note = next(d for d in plan.decisions if d.knob == "gpuMargin")
    assert (note.value, note.source) == ("3.0 GiB", "auto")


def test_grpo_plan_shows_the_margin_and_names_the_estimates(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["plan", str(H100_7B)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "Margin" in result.output and "Usable" in result.output
    assert "activations ~" in result.output and "vllm_kv_cache_and_overhead ~" in result.output
    assert "fp32_master_params_shard ~" not in result.output  # a count, not an estimate
    assert "logits ~" not in result.output  # counted: the chunked head's tensors
    out = CliRunner().invoke(cli, ["plan", str(H100_7B), "-o", "json"]).stdout
    memory = json.loads(out)["memory"]
    assert memory["gpuMarginGiB"] == pytest.approx(3.0, abs=0.1)
    assert memory["hostMarginGiB"] > 0
    assert {"activations", "vllm_kv_cache_and_overhead"} <= set(memory["estimatedTerms"])
    assert not {"logits", "weight_sync_buffers"} & set(memory["estimatedTerms"])
