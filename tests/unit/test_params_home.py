"""Where a rank keeps its parameters, and so where the optimizer steps: the CUDA-only
decision the plan-equals-tensors test cannot reach on a CPU (it checks the bytes)."""

from __future__ import annotations

import pytest
import torch

from grpo_api.trainer_config import ActorConfig
from grpo_trainer.modeling import params_home

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
