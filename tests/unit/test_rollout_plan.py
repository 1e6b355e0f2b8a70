"""The planner's rollout engine and tensor parallelism reach the trainer unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_api.job import load_manifest, parse_spec
from grpo_operator.planner import plan_memory
from grpo_operator.render.names import JobRef
from grpo_operator.render.trainer_config import trainer_config
from grpo_trainer.config import build_config

pytestmark = pytest.mark.unit
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("grpojob-*.yaml"))
JOB = JobRef("j", "ns", "uid")


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_plan_and_trainer_agree_on_engine_and_tp(path: Path) -> None:
    spec = load_manifest(path).spec
    plan = plan_memory(spec)
    raw = trainer_config(spec, plan, JOB)
    cfg = build_config(raw, environ=plan.env)  # what the trainer resolves in the pod
    assert cfg.rollout.tensor_parallel_size == plan.budget.rollout_tensor_parallel
    assert cfg.rollout.engine == ("vllm" if plan.geometry.is_gpu else "hf")
    assert cfg.resources.num_workers % cfg.rollout.tensor_parallel_size == 0


def test_examples_plan_the_tp_their_models_need() -> None:
    by_name = {p.name: plan_memory(load_manifest(p).spec) for p in EXAMPLES}
    # 72B in bf16 is ~137 GiB: one 80 GB GPU cannot hold it. vLLM gets 0.70 of the card
    # (what the actor and the margin leave), and a TP-4 slice (34 GiB) would leave less
    # than 40% of that for the KV cache: TP 8, 17 GiB each.
    assert by_name["grpojob-qwen2vl-72b-h100.yaml"].budget.rollout_tensor_parallel == 8
    assert by_name["grpojob-qwen25vl-7b-a100-40gb.yaml"].budget.rollout_tensor_parallel == 2
    assert by_name["grpojob-tiny.yaml"].budget.rollout_tensor_parallel == 1


def test_vllm_on_cpu_counts_its_resident_weights_and_cache() -> None:
    """No sleep mode on a CPU: the engine's weights and KV cache stay in host RAM."""
    doc = load_manifest(EXAMPLES[-1]).model_dump(by_alias=True, exclude_none=True)["spec"]
    assert doc["resources"]["gpuType"] == "cpu"
    hf = plan_memory(parse_spec(doc))
    vllm = plan_memory(parse_spec({**doc, "rollout": {"engine": "vllm"}}))
    assert hf.geometry.rollout_engine == "hf" and vllm.geometry.rollout_engine == "vllm"
    assert vllm.budget.host_terms["cpu_rollout_engine"] > hf.budget.host_terms["cpu_rollout_engine"]
    raw = trainer_config(parse_spec({**doc, "rollout": {"engine": "vllm"}}), vllm, JOB)
    assert raw["rollout"]["engine"] == "vllm"


def test_trainer_refuses_tp_that_does_not_divide_the_ranks() -> None:
    from grpo_trainer.config_error import ConfigError

    raw = {
        "model": {"path": "m"},
        "data": {"train_files": ["d.jsonl"]},
        "rollout": {"engine": "vllm", "tensor_parallel_size": 4},
        "resources": {"num_workers": 2},
        "trainer": {"rollout_batch_size": 2},
    }
    with pytest.raises(ConfigError, match=r"rollout.tensor_parallel_size \(4\) must divide"):
        build_config(raw, environ={})
    with pytest.raises(ConfigError, match=r"needs rollout\.engine 'vllm'"):
        build_config({**raw, "rollout": {"engine": "hf", "tensor_parallel_size": 2}}, environ={})
