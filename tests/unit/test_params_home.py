"""Where a rank keeps its parameters, and so where the optimizer steps: the CUDA-only
decision the plan-equals-tensors test cannot reach on a CPU (it checks the bytes)."""

from __future__ import annotations

import pytest
import torch

from grpo_api.trainer_config import ActorConfig
from grpo_trainer.model.modeling import params_home

pytestmark = pytest.mark.unit
CUDA = torch.device("cuda", 0)


def test_offloaded_parameters_live_and_step_on_the_host_of_a_gpu_rank() -> None:
    # With offload_params the optimizer's state must be on the host whatever
    # offload_optimizer says: moving it to the GPU for a step of CPU parameters would
    # mix devices (and the planner counts it on the host).
    for offload_optimizer in (False, True):
        actor = ActorConfig(offload_params=True, offload_optimizer=offload_optimizer)
        assert params_home(actor, CUDA) == torch.device("cpu")


def test_without_offload_they_stay_on_the_gpu() -> None:
    assert params_home(ActorConfig(offload_optimizer=True), CUDA) == CUDA


def test_a_cpu_rank_keeps_them_where_they_are() -> None:
    cpu = torch.device("cpu")
    assert params_home(ActorConfig(offload_params=True), cpu) == cpu


def test_offloaded_meta_params_go_where_they_live_and_buffers_where_forward_runs() -> None:
    # A GPU rank's sharded read with offloadParams: FSDP's lazy init refuses a parameter
    # that is not on the host ("FSDP parameters should be materialized on CPU"), which
    # is what an H100 run hit when every parameter went to the rank's device. The meta
    # device stands in for the host here (a CPU machine has only one real device).
    from grpo_trainer.model.modeling import _materialise

    class Rotary(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.register_buffer("inv_freq", torch.arange(3.0), persistent=False)

    with torch.device("meta"):
        model = torch.nn.Sequential(Rotary())
    model[0].inv_freq = torch.tensor([1.0, 0.5, 0.25])  # computed for real, as from_config
    _materialise(model, torch.device("cpu"), torch.device("meta"))
    assert {p.device.type for p in model.parameters()} == {"meta"}
    (inv_freq,) = model.buffers()
    assert inv_freq.device.type == "cpu"
    assert inv_freq.tolist() == [1.0, 0.5, 0.25]
