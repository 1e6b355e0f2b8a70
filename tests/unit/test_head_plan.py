"""The head pod sized for its work (planner/head.py): the driver's row index grows with
spec.data.rows, the length pass with the head's CPUs, `grpo plan` names both, and the
trainer is told to run the pass in the processes the plan counted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import INDEX_BYTES_PER_ROW, LENGTH_POOL_MIN_ROWS, LENGTH_WORKER_GIB
from grpo_api.job import parse_spec
from grpo_operator.planner import plan_memory
from grpo_operator.planner.head import driver_gib, head_terms
from grpo_operator.render.names import JobRef
from grpo_operator.render.trainer_config import trainer_config

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _spec(name: str, **data: Any) -> Any:
    body = yaml.safe_load((EXAMPLES / name).read_text())["spec"]
    body["data"].update(data)
    return parse_spec(body)


def test_the_head_counts_its_index_by_rows_and_its_length_pass_by_cpus() -> None:
    small = plan_memory(_spec("grpojob-qwen2vl-72b-h100.yaml", rows=200_000))
    large = plan_memory(_spec("grpojob-qwen2vl-72b-h100.yaml", rows=50_000_000))
    grown = driver_gib(large.geometry) - driver_gib(small.geometry)
    assert abs(grown - 49_800_000 * INDEX_BYTES_PER_ROW / 2**30) < 1e-9
    assert large.head.memory_gib > small.head.memory_gib
    terms = head_terms(small.geometry)
    assert terms["length_pass"] == small.head.cpus * LENGTH_WORKER_GIB
    geo = small.geometry  # a step's responses as text, held for the rewards
    assert terms["responses_in_flight"] == (geo.rollout_batch_size * geo.spec_rollout_n
                                            * geo.response_length * 8 / 2**30)
    lazy = plan_memory(_spec("grpojob-qwen2vl-72b-h100.yaml", rows=200_000,
                             promptLengths="lazy"))
    assert "length_pass" not in head_terms(lazy.geometry)
    # Fewer rows than the trainer starts a pool for: the driver counts them alone.
    few = plan_memory(_spec("grpojob-qwen2vl-72b-h100.yaml", rows=LENGTH_POOL_MIN_ROWS - 1))
    assert "length_pass" not in head_terms(few.geometry)
    (head,) = [d for d in large.decisions if d.knob == "headPod"]
    assert "the index of 50,000,000 rows 1.9 GiB" in head.reason
    assert f"the length pass in {large.head.cpus} processes" in head.reason
    assert "a step's responses as text" in head.reason


def test_the_trainer_runs_the_pass_in_the_processes_the_plan_counted() -> None:
    spec = _spec("grpojob-qwen2vl-72b-h100.yaml")
    plan = plan_memory(spec)
    cfg = trainer_config(spec, plan, JobRef("ns", "job", "uid"))
    assert cfg["data"]["length_workers"] == plan.head.cpus
    # A CPU job's head also runs the ranks: the pass runs in the driver alone.
    tiny = _spec("grpojob-tiny.yaml")
    tiny_plan = plan_memory(tiny)
    assert trainer_config(tiny, tiny_plan, JobRef("ns", "job", "uid"))["data"][
        "length_workers"] == 1
    assert "length_pass" not in head_terms(tiny_plan.geometry)
