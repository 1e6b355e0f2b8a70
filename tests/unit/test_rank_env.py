"""A rank's process under Ray: every GPU of its node visible, its own bound explicitly,
vLLM's all-reduce paths decided for that mode, LOCAL_RANK vLLM's only while it starts
(pure, or the trainer's code with a stand-in for what only a GPU and vLLM's CUDA build
run: no CPU test reaches vLLM's CUDA worker)."""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist

from grpo_api.trainer_config import ResourcesConfig
from grpo_trainer.cluster.collectives import custom_all_reduce
from grpo_trainer.cluster.placement import cuda_device_index
from grpo_trainer.cluster.rank_env import NOSET_CUDA, rank_env

pytestmark = pytest.mark.unit
GPU = ResourcesConfig(num_workers=8, gpus_per_worker=1)
CPU = ResourcesConfig(num_workers=2)


def test_a_cuda_rank_sees_its_node_and_runs_vllm_without_flashinfer_or_symm_mem() -> None:
    env = rank_env(GPU, attempt=0, inherited={})
    assert env[NOSET_CUDA] == "1"
    assert {k: env[k] for k in ("VLLM_ALLREDUCE_USE_FLASHINFER", "VLLM_USE_FLASHINFER_SAMPLER",
                                "VLLM_ALLREDUCE_USE_SYMM_MEM")} == dict.fromkeys(
        ("VLLM_ALLREDUCE_USE_FLASHINFER", "VLLM_USE_FLASHINFER_SAMPLER",
         "VLLM_ALLREDUCE_USE_SYMM_MEM"), "0")
    # The first attempt writes NCCL's INIT/NET lines to a file of the rank's own.
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET"
    assert env["NCCL_DEBUG_FILE"] == "/tmp/grpo-nccl/nccl.%h.%p.log"
    assert "NCCL_DEBUG" not in rank_env(GPU, attempt=1, inherited={})
    assert rank_env(CPU, attempt=0, inherited={}) == {}
    # The operator's Hang attempt (or the user) set NCCL_DEBUG: kept; the file is ours.
    hang = rank_env(GPU, attempt=0, inherited={"NCCL_DEBUG": "TRACE", "NCCL_DEBUG_FILE": "x"})
    assert "NCCL_DEBUG" not in hang and hang["NCCL_DEBUG_FILE"].startswith("/tmp/grpo-nccl/")


def test_the_rank_binds_the_gpu_ray_reserved_not_its_bundle_index() -> None:
    """Under NOSET Ray leaves CUDA_VISIBLE_DEVICES unset in the pod: the device is the
    GPU id Ray assigned to the actor's bundle, which need not be the bundle's index (the
    rank's local rank); where a runtime lists the GPUs, its position in that list."""
    assert cuda_device_index(["5"], None, 2) == 5
    assert cuda_device_index([5], "0,1,2,3,4,5,6,7", 2) == 5
    assert cuda_device_index(["5"], "5", 2) == 0  # Ray's own masking: one device, index 0


@pytest.mark.parametrize(("visible", "tp", "on"), [(8, 2, True), (8, 8, True), (1, 2, False),
                                                  (8, 1, False), (4, 8, False)])
def test_custom_all_reduce_runs_where_the_rank_sees_its_tp_peers(
        visible: int, tp: int, on: bool) -> None:
    """vLLM 0.32 all_reduce_utils.py:344-366 keys its P2P check by the visible devices and
    custom_all_reduce.py:297-314 opens IPC handles of the peers' buffers: with Ray's
    masking (one visible GPU) neither works, under NOSET both do."""
    assert custom_all_reduce(False, tp, visible) is on
    assert custom_all_reduce(True, tp, visible) is False  # the CPU build has no kernel


@pytest.fixture
def one_rank_world() -> Iterator[None]:
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def stand_in_vllm(monkeypatch: pytest.MonkeyPatch, seen: dict[str, Any]) -> None:
    """vLLM's CUDA build cannot start here: a stand-in LLM records what the engine was
    started with (its kwargs, LOCAL_RANK at that moment); CUDA reports 8 visible GPUs,
    device 3 current, as on a node under NOSET."""

    class LLM:
        def __init__(self, **kwargs: Any) -> None:
            seen.update(kwargs=kwargs, local_rank=os.environ.get("LOCAL_RANK"))
            # The engine empties vLLM's encoder cache before every sleep, its first too.
            self.llm_engine = types.SimpleNamespace(reset_encoder_cache=lambda: None)

    platform = types.SimpleNamespace(is_cpu=lambda: False, is_sleep_mode_available=lambda: False)
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM))
    monkeypatch.setitem(sys.modules, "vllm.platforms",
                        types.SimpleNamespace(current_platform=platform))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)


def test_vllm_starts_on_the_ranks_device_and_local_rank_comes_back(
        monkeypatch: pytest.MonkeyPatch, one_rank_world: None) -> None:
    from grpo_trainer.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig

    seen: dict[str, Any] = {}
    stand_in_vllm(monkeypatch, seen)
    monkeypatch.setenv("LOCAL_RANK", "2")  # the trainer's: the rank's place on its node
    VLLMEngine(VLLMEngineConfig("m", "bfloat16", 2, 64, 4, 0.5, 0, 0, True))
    assert seen["local_rank"] == "3"  # vLLM binds cuda:LOCAL_RANK: the rank's device
    assert os.environ["LOCAL_RANK"] == "2"
    assert seen["kwargs"]["disable_custom_all_reduce"] is False
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)  # Ray's masking
    VLLMEngine(VLLMEngineConfig("m", "bfloat16", 2, 64, 4, 0.5, 0, 0, True))
    assert seen["kwargs"]["disable_custom_all_reduce"] is True


def test_the_rendezvous_port_is_held_from_the_moment_it_is_picked(tmp_path: Any) -> None:
    """Rank 0's store listens on the port the OS picked at bind time: no other process
    (Ray, vLLM, the object store on a busy node) can take it before the ranks connect,
    as it could between bind-then-close and the store's own bind; a rank connects."""
    import errno
    import socket
    from datetime import timedelta

    from grpo_api.trainer_config import Config
    from grpo_trainer.rank.worker import Worker

    cfg = Config.model_validate({"model": {"path": str(tmp_path)},
                                 "data": {"train_files": [str(tmp_path / "d.jsonl")]},
                                 "resources": {"num_workers": 2}})
    rank0 = Worker(cfg, 0, 2)
    host, port = rank0.open_rendezvous()
    with socket.socket() as s, pytest.raises(OSError) as taken:
        s.bind(("", port))
    assert taken.value.errno == errno.EADDRINUSE
    peer = dist.TCPStore(host, port, 2, is_master=False, timeout=timedelta(seconds=30))
    peer.set("joined", "1")
