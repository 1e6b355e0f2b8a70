"""Every rung of the OOM ladders has a resume test for what it changes in the trainer.

A rung's next attempt resumes the checkpoint the attempt before it wrote, under the
settings the rung changed. This applies each rung of planner/ladder.py's ladders
(directly, on a plan where it applies) and renders the per-attempt trainer config before
and after: what changed must be what the rung's test in tests/trainer/test_rung_resume.py
resumes under. A new rung, or a rung that starts to change another trainer setting,
fails here until a resume test covers it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from grpo_api.job import GRPOJobSpec, parse_spec
from grpo_operator.planner.core import plan_memory, replan
from grpo_operator.planner.ladder import KV_CACHE_LADDER, LADDERS
from grpo_operator.planner.types import Plan
from grpo_operator.render.names import JobRef
from grpo_operator.render.trainer_config import trainer_config

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
JOB = JobRef("j", "ns", "uid")
# rung -> (the trainer settings it may change, the trainer-tier test that resumes under them)
COVERED: dict[str, tuple[set[str], str]] = {
    "gradient checkpointing on": ({"actor.gradient_checkpointing"},
                                  "test_gradient_checkpointing_on_resumes_exactly"),
    # Its token budget (by samples only when the spec pins microBatchSize, which keeps
    # the rung from applying): either path, one resume test parametrized over both.
    "halve micro-batch": ({"actor.micro_batch_size", "actor.micro_batch_tokens"},
                          "test_halved_micro_batch_resumes_with_the_same_rollouts_and_carried_"
                          "moments"),
    # The TP it may raise with it is the rollout engine's layout: no checkpoint holds it.
    "lower rollout GPU memory utilisation": ({"rollout.gpu_memory_utilization",
                                              "rollout.tensor_parallel_size"},
                                             "test_lower_vllm_memory_resumes_exactly"),
    "bf16 training": ({"actor.precision"},
                      "test_bf16_resumes_a_mixed_checkpoint_with_its_master_as_the_kahan_pair"),
    "offload optimizer": ({"actor.offload_optimizer"}, "test_offload_on_then_off_resumes_exactly"),
    "offload params": ({"actor.offload_params"}, "test_offload_on_then_off_resumes_exactly"),
    "params offload off": ({"actor.offload_params"}, "test_offload_on_then_off_resumes_exactly"),
    "optimizer offload off": ({"actor.offload_optimizer"},
                              "test_offload_on_then_off_resumes_exactly"),
    # Ray's and the pods': nothing reaches the trainer, whose resume is then the plain one
    # (tests/trainer/test_checkpoint_resume.py).
    # vLLM's KV cache ran short (rank phase kv_cache): its share up, and the state offloaded
    # to make room for it.
    "raise rollout GPU memory utilisation": ({"rollout.gpu_memory_utilization",
                                              "rollout.tensor_parallel_size"},
                                             "test_lower_vllm_memory_resumes_exactly"),
    "offload optimizer for the KV cache": ({"actor.offload_optimizer",
                                            "rollout.gpu_memory_utilization",
                                            "rollout.tensor_parallel_size"},
                                           "test_offload_on_then_off_resumes_exactly"),
    "offload params for the KV cache": ({"actor.offload_params",
                                         "rollout.gpu_memory_utilization",
                                         "rollout.tensor_parallel_size"},
                                        "test_offload_on_then_off_resumes_exactly"),
    "smaller Ray object store": (set(), ""),
    "pod memory to node allocatable": (set(), ""),
}


def _spec() -> GRPOJobSpec:
    return parse_spec({
        "recovery": {"allowPrecisionChange": True},
        "model": {"path": "Qwen/Qwen2.5-VL-3B-Instruct"},
        "data": {"train": "t", "maxPromptLength": 512, "maxResponseLength": 256},
        "algorithm": {"rolloutN": 8},
        "training": {"rolloutBatchSize": 512, "globalBatchSize": 64},  # Ray store > 2 GiB
        "resources": {"gpuType": "H100-80GB", "nodes": 1, "gpusPerNode": 4},
        "checkpoint": {"size": "50Gi"},
    })


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        out |= _flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v}
    return out


def _where_it_applies(plan: Plan, name: str) -> Plan:
    """The plan, or (for the HostOOM rungs that turn offloading off) one with it on, or
    (for the KV cache's raise) one whose utilisation is below the most."""
    if name == "raise rollout GPU memory utilisation":
        return replan(plan, replace(plan.settings, rollout_gpu_memory_utilization=0.4), "")
    if name.endswith("offload off"):
        on = replace(plan.settings, offload_params=True, offload_optimizer=True)
        return replan(plan, on, "")
    return plan


EVERY_LADDER = (*LADDERS.values(), KV_CACHE_LADDER)


@pytest.mark.parametrize("name", sorted({n for ladder in EVERY_LADDER for n, _ in ladder}))
def test_what_each_rung_changes_in_the_trainer_has_a_resume_test(name: str) -> None:
    assert name in COVERED, f"rung {name!r} has no resume test (tests/trainer/test_rung_resume.py)"
    spec = _spec()
    rung = next(r for ladder in EVERY_LADDER for n, r in ladder if n == name)
    before = _where_it_applies(plan_memory(spec), name)
    settings = rung(before)
    assert settings is not None, f"{name} does not apply to the test's plan"
    after = replan(before, settings, "", name)
    old, new = (_flat(trainer_config(spec, p, JOB)) for p in (before, after))
    # The plan's own figures, exported beside the readings, follow every rung; nothing the
    # trainer does, or resumes, depends on them.
    changed = {k for k in old.keys() | new.keys() if old.get(k) != new.get(k)
               and not k.startswith("metrics.planned_peaks.")}
    allowed, test = COVERED[name]
    assert changed <= allowed, f"{name} changes {changed - allowed} in the trainer config"
    if allowed:
        assert changed, f"{name} changed nothing the trainer reads"
        source = (ROOT / "tests/trainer/test_rung_resume.py").read_text()
        assert f"def {test}(" in source
