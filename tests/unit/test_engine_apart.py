"""A disaggregated rollout engine (rollout/engine_actor.py): its process environment,
and the tensor-parallel size it refuses.

Tensor parallel > 1 apart is refused at apply, in the trainer's config and by the
planner, decided from vLLM 0.32.0's source as installed: the engine's Ray actor has no
torch.distributed for the external launcher, so a larger TP gets an executor of its own
processes (``vllm/config/parallel.py``: "mp" by default), whose ``collective_rpc`` pickles
its arguments (``vllm/v1/executor/multiproc_executor.py``), while the weight push hands
``reload_weights`` a generator, which only the in-process executor takes
(``vllm/v1/executor/uniproc_executor.py``: ``run_method`` on the worker in this process)."""

from __future__ import annotations

import copy
import inspect
import pickle
from typing import Any

import pytest

from grpo_api.job import SpecError, parse_spec
from grpo_api.trainer_config import ENGINE_APART_TENSOR_PARALLEL, Config
from grpo_operator.webhook import admission_problem
from grpo_testbed.examples import example_job
from grpo_testkit.configs import text_config
from grpo_trainer.cluster.rank_env import NOSET_CUDA, engine_env, rank_env, runtime_env
from grpo_trainer.config import build_config

pytestmark = pytest.mark.unit


def _apart(tmp: Any, tp: int = 1, gpus: float = 1, **resources: Any) -> Config:
    return build_config(text_config(
        tmp / "model", tmp / "data.jsonl",
        resources={"num_workers": 2, **resources},
        trainer={"rollout_batch_size": 4},
        rollout={"engine": "vllm", "placement": "disaggregated", "tensor_parallel_size": tp,
                 "disaggregated": {"nodes": 1, "engines_per_node": 2,
                                   "gpus_per_engine": gpus}},
    ), environ={})


def test_an_engine_on_gpus_gets_the_ranks_environment_but_its_own_gpu_mask(tmp_path: Any
                                                                            ) -> None:
    """The vLLM switches and the first attempt's NCCL report, as a rank's; not NOSET: vLLM's
    in-process executor binds cuda:0 of what the process sees (uniproc_executor.py
    ``_distributed_args``), so under Ray's mask that is the engine's own GPU."""
    cfg = _apart(tmp_path, gpus_per_worker=1)
    ranks = rank_env(cfg.resources, attempt=0, inherited={})
    engines = engine_env(cfg, attempt=0, inherited={})
    assert engines and NOSET_CUDA not in engines
    assert engines == {k: v for k, v in ranks.items() if k != NOSET_CUDA}
    assert engines["VLLM_USE_FLASHINFER_SAMPLER"] == "0" and engines["NCCL_DEBUG"] == "INFO"
    assert "NCCL_DEBUG" not in engine_env(cfg, attempt=1, inherited={})
    # What the pod already sets stays (the Hang attempt's NCCL_DEBUG), as for a rank.
    assert "NCCL_DEBUG" not in engine_env(cfg, attempt=0, inherited={"NCCL_DEBUG": "WARN"})
    assert runtime_env(engines) == {"runtime_env": {"env_vars": engines}}
    # Engines on the host (or on a test cluster's fake GPUs) need none.
    assert engine_env(_apart(tmp_path, gpus=0), attempt=0, inherited={}) == {}
    fake = _apart(tmp_path, gpus_per_worker=1, fake_gpus=True)
    assert engine_env(fake, attempt=0, inherited={}) == {} and runtime_env({}) == {}


def test_vllm_0_32_hands_a_weight_stream_only_to_its_in_process_executor() -> None:
    """What the refusal rests on, read from the installed vLLM."""
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    mp = inspect.getsource(MultiprocExecutor.collective_rpc)
    assert "rpc_broadcast_mq.enqueue((send_method, args, kwargs" in mp
    assert "run_method(self.driver_worker, method, args, kwargs)" in inspect.getsource(
        UniProcExecutor.collective_rpc)
    stream = ((n, n) for n in ("a", "b"))  # what EngineWorker.receive_weights passes
    with pytest.raises(TypeError, match="generator"):
        pickle.dumps(stream)


def test_tensor_parallel_apart_is_refused_naming_the_field(tmp_path: Any) -> None:
    assert ENGINE_APART_TENSOR_PARALLEL == 1
    with pytest.raises(ValueError, match=r"rollout\.tensor_parallel_size: 2; a rollout "
                                         r"engine apart"):
        _apart(tmp_path, tp=2, gpus=2, gpus_per_worker=1)
    spec = copy.deepcopy(example_job("grpojob-qwen25vl-7b-h100.yaml")["spec"])
    spec["resources"]["nodes"] = 2
    spec["rollout"] = {"placement": "disaggregated",
                       "disaggregated": {"gpusPerNode": 8, "tensorParallelSize": 2}}
    with pytest.raises(SpecError, match=r"rollout\.disaggregated\.tensorParallelSize: 2"):
        parse_spec(spec)
    assert "rollout.disaggregated.tensorParallelSize: 2; a rollout engine apart" in (
        admission_problem(spec, None) or "")
    spec["rollout"]["disaggregated"]["tensorParallelSize"] = 1
    assert parse_spec(spec).rollout.disaggregated is not None
