"""AdamW for parameters stored in bf16, with a compensated update (``actor.precision: bf16``).

A bf16 weight near 1.0 moves in steps of 2**-8; an Adam update of 1e-5 rounds to
nothing and training stalls. Kahan compensation keeps, per parameter, a bf16 buffer
with what rounding lost: the pair (weight, compensation) holds the weight to about 16
mantissa bits, and the loss is re-added at the next step instead of dropped. The
forward pass sees the bf16 weight alone (it is what FSDP gathers and the rollout
engine receives).

Every step's arithmetic is float32, one parameter at a time (its temporaries are the
only float32 copies alive: a foreach over all parameters would hold a float32 model),
and the results are stored in bf16: moments rounded to nearest, the weight as
``round(master)`` with ``master - round(master)`` as the new compensation. Works on
FSDP2 DTensor parameters by updating their local shards in place; the state is
DTensors shaped like the parameters, so DCP saves and reshards it like torch's AdamW
state.

``compensation="stochastic"`` (stochastic rounding of the weight, no buffer) and
``"none"`` (plain bf16 AdamW) exist for the comparison in ``bench/bench_bf16.py``;
the trainer uses Kahan (docs/trainer.md "bf16" says why).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch.distributed.tensor import DTensor

Compensation = Literal["kahan", "stochastic", "none"]


def _local(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank updates in place: a DTensor's local shard, else itself."""
    return t.to_local() if isinstance(t, DTensor) else t


def stochastic_round_to_bf16(x: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """float32 -> bf16, rounding up with probability equal to the dropped fraction."""
    bits = x.view(torch.int32)
    noise = torch.randint(
        0, 1 << 16, x.shape, dtype=torch.int32, device=x.device, generator=generator
    )
    # Adding noise below the kept 16 bits, then truncating them: an unbiased rounding.
    return ((bits + noise) & -65536).view(torch.float32).to(torch.bfloat16)


class BF16AdamW(torch.optim.Optimizer):
    """Decoupled-weight-decay Adam (torch's AdamW maths) with bf16 state.

    State per parameter: ``step`` (float32 scalar, as torch's Adam), ``exp_avg``,
    ``exp_avg_sq`` and, with Kahan, ``compensation``, all in the parameter's dtype.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        compensation: Compensation = "kahan",
        generator: torch.Generator | None = None,
    ) -> None:
        if compensation not in ("kahan", "stochastic", "none"):
            raise ValueError(f"compensation {compensation!r}: use kahan, stochastic or none")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)
        self.compensation = compensation
        # Stochastic rounding's stream (bench only: it is not in the checkpoint).
        self.generator = generator

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
        for group in self.param_groups:
            lr, wd, eps = float(group["lr"]), float(group["weight_decay"]), float(group["eps"])
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self._init_state(p)
                state["step"] += 1
                t = float(state["step"].item())
                self._update(
                    _local(p),
                    _local(p.grad),
                    state,
                    lr=lr,
                    wd=wd,
                    eps=eps,
                    beta1=beta1,
                    beta2=beta2,
                    bias1=1.0 - beta1**t,
                    bias2=1.0 - beta2**t,
                )
        return loss

    def _update(
        self,
        p: torch.Tensor,
        grad: torch.Tensor,
        state: dict[str, Any],
        *,
        lr: float,
        wd: float,
        eps: float,
        beta1: float,
        beta2: float,
        bias1: float,
        bias2: float,
    ) -> None:
        exp_avg, exp_avg_sq = _local(state["exp_avg"]), _local(state["exp_avg_sq"])
        g = grad.float()
        m = exp_avg.float().lerp_(g, 1.0 - beta1)
        v = exp_avg_sq.float().mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        exp_avg.copy_(m)
        exp_avg_sq.copy_(v)
        denom = v.div_(bias2).sqrt_().add_(eps)
        master = p.float()
        comp = _local(state["compensation"]) if self.compensation == "kahan" else None
        if comp is not None:
            master.add_(comp.float())
        master.mul_(1.0 - lr * wd).addcdiv_(m, denom, value=-lr / bias1)
        if self.compensation == "stochastic":
            p.copy_(stochastic_round_to_bf16(master, self.generator))
            return
        p.copy_(master)  # round to nearest
        if comp is not None:
            comp.copy_(master.sub_(p.float()))  # what the rounding lost, re-added next step
