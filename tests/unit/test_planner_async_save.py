"""checkpoint.asyncSave costs host RAM: the staging copy each rank keeps is planned for."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_api.job import parse_spec
from grpo_operator.planner import InfeasibleError, plan_memory
from grpo_operator.planner.pinned import model_tensors, pinned_factor
from grpo_operator.render.names import JobRef
from grpo_operator.render.trainer_config import trainer_config
from grpo_trainer.config import build_config

pytestmark = pytest.mark.unit
GIB = 2**30


def doc(async_save: bool, **resources: Any) -> dict[str, Any]:
    return {
        "model": {"path": "Qwen/Qwen2.5-VL-7B-Instruct"},
        "data": {"train": "t"},
        "resources": {"gpuType": "H100-80GB", "nodes": 1, **resources},
        "checkpoint": {"size": "100Gi", "asyncSave": async_save},
    }


def test_async_save_adds_each_ranks_fp32_weights_and_adam_state_to_the_host_budget() -> None:
    off = plan_memory(parse_spec(doc(False)))
    on = plan_memory(parse_spec(doc(True)))
    g = on.geometry
    # 8 ranks on the node, each staging its shard: 4 B of fp32 weight + 8 B of Adam moments,
    # each tensor in a pinned block as torch's host allocator sizes it (planner/pinned.py:
    # above 1 MiB exact, below rounded up to a power of two).
    tensors = model_tensors(g.shape)
    want = g.gpus_per_node * g.shape.parameters / g.world_size / GIB * (
        4 * pinned_factor(tensors, g.world_size, 4) + 8 * pinned_factor(tensors, g.world_size, 4))
    assert want > g.gpus_per_node * g.shape.parameters / g.world_size * 12 / GIB
    assert off.budget.host_terms["async_save_staging"] == 0
    assert on.budget.host_terms["async_save_staging"] == pytest.approx(want)
    assert sum(on.budget.host_terms.values()) == pytest.approx(
        sum(off.budget.host_terms.values()) + want)
    # ...and the worker pod asks for memory that holds it (the sync-save pod is sized by
    # rank 0's full-model load, which is larger than its training-time need).
    assert on.worker is not None and off.worker is not None
    assert on.worker.memory_gib >= sum(on.budget.host_terms.values())
    assert on.worker.memory_gib > off.worker.memory_gib


def test_a_host_that_fits_sync_saves_refuses_async_ones_and_names_the_buffer() -> None:
    fits = plan_memory(parse_spec(doc(False, hostMemory="128Gi")))
    assert fits.budget.fits
    with pytest.raises(InfeasibleError) as err:
        plan_memory(parse_spec(doc(True, hostMemory="128Gi")))
    assert "async_save_staging" in str(err.value)


@pytest.mark.parametrize("async_save", [False, True])
def test_the_trainer_saves_the_way_the_plan_budgeted(async_save: bool) -> None:
    spec = parse_spec(doc(async_save))
    plan = plan_memory(spec)
    raw = trainer_config(spec, plan, JobRef("j", "ns", "uid"))
    cfg = build_config(raw, environ={})  # what the trainer resolves in the pod
    assert cfg.checkpoint.async_save is async_save
