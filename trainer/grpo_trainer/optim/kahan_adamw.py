"""AdamW for parameters stored in bf16, with a compensated update (``actor.precision: bf16``).

A bf16 weight near 1.0 moves in steps of 2**-8; an Adam update of 1e-5 rounds to
nothing and training stalls. Kahan compensation keeps, per parameter, a bf16 buffer
with what rounding lost: the pair (weight, compensation) holds the weight to about 16
mantissa bits, and the loss is re-added at the next step instead of dropped. The
forward pass sees the bf16 weight alone (it is what FSDP gathers and the rollout
engine receives).

Every step's arithmetic is float32, one parameter at a time and in chunks of 16M
elements (the chunk's temporaries are the only float32 copies alive: a foreach over all
parameters would hold a float32 model), and the results are stored in bf16: the weight
as ``round(master)`` with ``master - round(master)`` as the new compensation; the first
moment rounded to nearest (it changes by 10% of the gradient each step, far above
bf16's resolution); the second moment rounded stochastically: ``0.999 v + 0.001 g**2``
rounds back to ``v`` whenever the change is under half a bf16 step (0.2%), so rounded
to nearest it can grow but never decay, and after the gradients shrink it overestimates
them for good (measured: 5x after a 10x drop, steps 2.2x too small). Stochastic
rounding is unbiased, and its noise is a hash of (step, parameter, element), so there
is no generator state and a resumed run draws the same bits.

Works on FSDP2 DTensor parameters by updating their local shards in place; the state
is DTensors shaped like the parameters, so DCP saves and reshards it like torch's
AdamW state.

``compensation="stochastic"`` (the weight stochastically rounded too, no buffer),
``"none"`` (plain bf16 AdamW: everything rounded to nearest) and
``stochastic_variance=False`` exist for the comparison in ``bench/bench_bf16.py``; the
trainer uses Kahan (docs/trainer.md "bf16" says why).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.distributed.tensor import DTensor

Compensation = Literal["kahan", "stochastic", "none"]


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank updates in place: a DTensor's local shard, else itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def hash_noise16(
    shape: torch.Size, step: int, salt: int, device: torch.device, offset: int = 0
) -> torch.Tensor:
    """16 pseudo-random bits per element (int32), a function of (element, step, salt) only.

    A murmur3-style finaliser over int32 arithmetic (wrapping multiplies; the shifts are
    arithmetic, which changes the hash, not its spread). Elements are numbered from
    ``offset`` in this rank's local shard, so a resharded run draws other bits (it also
    restores no RNG)."""
    seed = (step * 0x01000193 + salt * 0x2C1B3C6D) & 0x7FFFFFFF
    x = torch.arange(offset, offset + math.prod(shape), dtype=torch.int32, device=device)
    x = x * -1640531535 + seed  # 0x9E3779B1 as int32
    x = x ^ (x >> 16)
    x = x * -2048144789  # 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * -1028477387  # 0xC2B2AE35
    x = x ^ (x >> 16)
    return (x & 0xFFFF).view(shape)


def stochastic_round_to_bf16(x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16, rounding away from zero with probability equal to the dropped
    fraction: ``noise`` (uniform in [0, 2**16)) is added below the kept 16 bits, which
    are then truncated."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)


@dataclass(frozen=True)
class _Hyper:
    """One parameter's step: the group's settings, bias corrections, hash seed."""

    lr: float
    wd: float
    eps: float
    beta1: float
    beta2: float
    bias1: float
    bias2: float
    step: int
    salt: int


class BF16AdamW(torch.optim.Optimizer):
    """Decoupled-weight-decay Adam (torch's AdamW maths) with bf16 state.

    State per parameter: ``step`` (float32 scalar, as torch's Adam), ``exp_avg``,
    ``exp_avg_sq`` and, with Kahan, ``compensation``, all in the parameter's dtype.
    """

    # Elements per chunk of the update: bounds its float32 temporaries (~450 MiB).
    chunk_elements = 1 << 24

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        compensation: Compensation = "kahan",
        *,
        stochastic_variance: bool = True,
    ) -> None:
        if compensation not in ("kahan", "stochastic", "none"):
            raise ValueError(f"compensation {compensation!r}: use kahan, stochastic or none")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.compensation = compensation
        # False: the second moment rounded to nearest (the bench shows what that costs).
        self.stochastic_variance = stochastic_variance and compensation != "none"

    def _init_state(self, p: torch.Tensor) -> dict[str, Any]:
        state = self.state[p]
        if not state:
            state["step"] = torch.tensor(0.0, dtype=torch.float32)
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            if self.compensation == "kahan":
                state["compensation"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        return state

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        salt = 0  # the parameter's place in the groups: the same in every run of a job
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                salt += 1
                if p.grad is None:
                    continue
                state = self._init_state(p)
                state["step"] += 1
                t = float(state["step"].item())
                hyper = _Hyper(
                    lr=float(group["lr"]),
                    wd=float(group["weight_decay"]),
                    eps=float(group["eps"]),
                    beta1=beta1,
                    beta2=beta2,
                    bias1=1.0 - beta1**t,
                    bias2=1.0 - beta2**t,
                    step=int(t),
                    salt=salt,
                )
                self._update(p, state, hyper)
        return loss

    def _update(self, p: torch.Tensor, state: dict[str, Any], hyper: _Hyper) -> None:
        """One parameter's local shard, in chunks of ``chunk_elements``: the float32
        temporaries (about 7 x 4 bytes per element of a chunk) stay bounded however
        large the parameter (a 150k-vocabulary embedding shard would otherwise take GBs)."""
        comp = state.get("compensation")
        tensors = [
            local_shard(t)
            for t in (p, p.grad, state["exp_avg"], state["exp_avg_sq"], comp)
            if t is not None
        ]
        if not all(t.is_contiguous() for t in tensors):
            self._update_chunk(*tensors, hyper=hyper, offset=0)
            return
        flat = [t.view(-1) for t in tensors]
        size = self.chunk_elements
        for start in range(0, flat[0].numel(), size):
            self._update_chunk(*(f[start : start + size] for f in flat), hyper=hyper, offset=start)

    def _update_chunk(
        self,
        p: torch.Tensor,
        grad: torch.Tensor,
        exp_avg: torch.Tensor,
        exp_avg_sq: torch.Tensor,
        comp: torch.Tensor | None = None,
        *,
        hyper: _Hyper,
        offset: int,
    ) -> None:
        h = hyper
        g = grad.float()
        m = exp_avg.float().lerp_(g, 1.0 - h.beta1)
        v = exp_avg_sq.float().mul_(h.beta2).addcmul_(g, g, value=1.0 - h.beta2)
        del g
        exp_avg.copy_(m)
        if self.stochastic_variance:
            noise = hash_noise16(v.shape, h.step, 2 * h.salt, v.device, offset)
            exp_avg_sq.copy_(stochastic_round_to_bf16(v, noise))
            del noise
        else:
            exp_avg_sq.copy_(v)
        denom = v.div_(h.bias2).sqrt_().add_(h.eps)
        master = p.float()
        if comp is not None:
            master.add_(comp.float())
        master.mul_(1.0 - h.lr * h.wd).addcdiv_(m, denom, value=-h.lr / h.bias1)
        del m, denom, v
        if self.compensation == "stochastic":
            noise = hash_noise16(p.shape, h.step, 2 * h.salt + 1, p.device, offset)
            p.copy_(stochastic_round_to_bf16(master, noise))
            return
        p.copy_(master)  # round to nearest
        if comp is not None:
            comp.copy_(master.sub_(p.float()))  # what the rounding lost, re-added next step
