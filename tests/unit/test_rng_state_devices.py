"""A checkpoint keeps the CUDA RNG of the rank's own GPU only (checkpointing/rank.py):
a rank sees every GPU of its node, and saving all of them made a resume on a node with
fewer GPUs raise IndexError. CUDA cannot run here, so a stand-in for ``torch.cuda``'s RNG
calls plays the GPUs (named as the mock it is); the CPU streams are the real ones."""

from __future__ import annotations

import torch

from grpo_trainer.checkpointing.rank import _rng_state, _set_rng_state


class CudaRngMockedOnCpu:
    """``torch.cuda``'s RNG calls for ``visible`` GPUs, this process on ``device``."""

    def __init__(self, visible: int, device: int) -> None:
        self.states = [torch.full((16,), i, dtype=torch.uint8) for i in range(visible)]
        self.device = device

    def is_available(self) -> bool:
        return True

    def current_device(self) -> int:
        return self.device

    def get_rng_state(self) -> torch.Tensor:
        return self.states[self.device].clone()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.states[self.device] = state.clone()

    def get_rng_state_all(self) -> list[torch.Tensor]:
        return [s.clone() for s in self.states]


def test_only_the_ranks_own_gpu_is_saved_and_restored() -> None:
    eight = CudaRngMockedOnCpu(visible=8, device=5)
    state = _rng_state(eight)
    assert torch.equal(state["cuda"], eight.states[5])  # one tensor, not eight
    four = CudaRngMockedOnCpu(visible=4, device=1)  # resumed where fewer GPUs show
    _set_rng_state(state, four)
    assert torch.equal(four.states[1], eight.states[5])


def test_an_older_checkpoint_with_every_gpu_restores_its_own_or_starts_afresh() -> None:
    eight = CudaRngMockedOnCpu(visible=8, device=0)
    old = {**_rng_state(eight), "cuda": eight.get_rng_state_all()}
    two = CudaRngMockedOnCpu(visible=2, device=1)
    _set_rng_state(old, two)
    assert torch.equal(two.states[1], eight.states[1])
    far = CudaRngMockedOnCpu(visible=16, device=12)  # no saved state: no IndexError
    before = far.states[12].clone()
    _set_rng_state({**old, "cuda": old["cuda"][:4]}, far)
    assert torch.equal(far.states[12], before)
