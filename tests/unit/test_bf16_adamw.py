"""BF16AdamW (actor.precision bf16) against a float64 AdamW, and the storage hook."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from grpo_api.trainer_config import ActorConfig
from grpo_trainer.model.precision import build_optimizer, store_params
from grpo_trainer.optim import BF16AdamW, Compensation
from grpo_trainer.optim.kahan_adamw import hash_noise16, stochastic_round_to_bf16

pytestmark = pytest.mark.unit

STEPS = 300
LR = 1e-4  # each update is ~1e-4: far below half a bf16 step at weights of order 1 (2**-9)


def _problem() -> tuple[torch.Tensor, list[torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    # Weights of order 1, exactly representable in bf16 so both sides start equal.
    w0 = (torch.rand(4096, generator=g, dtype=torch.float64) * 1.5 + 0.5).bfloat16().double()
    # A consistent pull plus noise, like a policy gradient; rounded to bf16 because the
    # bf16 mode's gradients are bf16: only the update's precision is compared.
    drift = torch.randn(4096, generator=g, dtype=torch.float64)
    grads = [
        (drift + 0.5 * torch.randn(4096, generator=g, dtype=torch.float64)).bfloat16().double()
        for _ in range(STEPS)
    ]
    return w0, grads


def _reference(w0: torch.Tensor, grads: list[torch.Tensor]) -> torch.Tensor:
    p = nn.Parameter(w0.clone())
    opt = torch.optim.AdamW([p], lr=LR, weight_decay=0.01, foreach=False)
    for grad in grads:
        p.grad = grad.clone()
        opt.step()
    return p.detach()


def _bf16(
    w0: torch.Tensor, grads: list[torch.Tensor], compensation: Compensation
) -> tuple[torch.Tensor, torch.Tensor]:
    """The bf16 weights, and the value they stand for (weight + compensation)."""
    p = nn.Parameter(w0.bfloat16())
    opt = BF16AdamW([p], lr=LR, weight_decay=0.01, compensation=compensation)
    for grad in grads:
        p.grad = grad.bfloat16()
        opt.step()
    assert p.dtype == torch.bfloat16
    state = opt.state[p]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
    held = p.detach().double()
    if "compensation" in state:
        held = held + state["compensation"].double()
    return p.detach().double(), held


@pytest.mark.parametrize(("compensation", "tracks"), [("kahan", True), ("none", False)])
def test_kahan_follows_float64_adamw_where_plain_bf16_stalls(
    compensation: Compensation, tracks: bool
) -> None:
    w0, grads = _problem()
    ref = _reference(w0, grads)
    weights, held = _bf16(w0, grads, compensation)
    moved = (ref - w0).abs()
    assert moved.mean() > 0.01  # the reference really moved, by many bf16 half-steps
    # Error of the distance travelled, relative to the distance, of the value the
    # optimizer holds: what is left is the bf16 moments' rounding noise.
    rel = ((held - ref).abs() / moved).mean().item()
    if tracks:
        assert rel < 0.02, rel
        # The bf16 weights the forward pass sees: the reference's rounded to bf16 (half a
        # step, up to 2**-8 relative) give or take the moments' noise: within one step.
        assert ((weights - ref).abs() <= ref.abs() * 2**-7).all()
    else:
        # Plain bf16 AdamW: updates below half a step round away; the weights stall.
        assert rel > 0.5, rel


def test_state_round_trip_continues_bit_identically() -> None:
    w0, grads = _problem()
    p = nn.Parameter(w0.bfloat16())
    opt = BF16AdamW([p], lr=LR, weight_decay=0.01)
    for grad in grads[:50]:
        p.grad = grad.bfloat16()
        opt.step()
    saved = copy.deepcopy(opt.state_dict())
    assert set(saved["state"][0]) == {"step", "exp_avg", "exp_avg_sq", "compensation"}
    assert saved["state"][0]["compensation"].abs().sum() > 0  # it carries real information

    q = nn.Parameter(p.detach().clone())
    resumed = BF16AdamW([q], lr=LR, weight_decay=0.01)
    resumed.load_state_dict(saved)
    for grad in grads[50:100]:
        for param, o in ((p, opt), (q, resumed)):
            param.grad = grad.bfloat16()
            o.step()
    assert torch.equal(p, q)
    assert torch.equal(opt.state[p]["compensation"], resumed.state[q]["compensation"])


def test_bf16_precision_stores_parameters_in_bf16_and_keeps_buffers() -> None:
    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = nn.Linear(4, 4)
            self.register_buffer("inv_freq", torch.rand(2), persistent=False)

    mixed, bf16 = Block(), Block()
    before = {k: v.clone() for k, v in mixed.state_dict().items()}
    store_params(mixed, ActorConfig(precision="mixed"))
    store_params(bf16, ActorConfig(precision="bf16"))
    assert all(torch.equal(v, before[k]) for k, v in mixed.state_dict().items())
    assert bf16.linear.weight.dtype == bf16.linear.bias.dtype == torch.bfloat16
    # Rotary tables are buffers: kept in float32.
    assert bf16.inv_freq.dtype == torch.float32

    assert isinstance(build_optimizer(bf16.parameters(), ActorConfig(precision="bf16")), BF16AdamW)
    assert type(build_optimizer(mixed.parameters(), ActorConfig())) is torch.optim.AdamW


@pytest.mark.parametrize(("stochastic", "tracks"), [(True, True), (False, False)])
def test_second_moment_decays_when_the_gradients_shrink(stochastic: bool, tracks: bool) -> None:
    """0.999 v + 0.001 g**2 moves v by less than half a bf16 step: rounded to nearest it
    never decays, and after the gradients drop 10x the steps come out far too small."""
    g = torch.Generator().manual_seed(1)
    p = nn.Parameter(torch.zeros(2048, dtype=torch.bfloat16))
    ref = nn.Parameter(torch.zeros(2048, dtype=torch.float64))
    opt = BF16AdamW([p], lr=1e-5, weight_decay=0.0, stochastic_variance=stochastic)
    ref_opt = torch.optim.AdamW([ref], lr=1e-5, weight_decay=0.0, foreach=False)
    for step in range(2500):
        scale = 1.0 if step < 500 else 0.1
        grad = (torch.randn(2048, generator=g, dtype=torch.float64) * scale).bfloat16()
        p.grad, ref.grad = grad, grad.double()
        opt.step()
        ref_opt.step()
    ratio = (opt.state[p]["exp_avg_sq"].double() / ref_opt.state[ref]["exp_avg_sq"]).median()
    if tracks:
        assert abs(ratio.item() - 1.0) < 0.05, ratio
    else:
        assert ratio.item() > 2.0, ratio


def test_stochastic_rounding_is_unbiased_and_repeatable() -> None:
    # A value 30% of the way between two bf16 neighbours (1.0 and 1.0078125).
    x = torch.full((1 << 16,), 1.0 + 0.3 * 2**-7)
    noise = hash_noise16(x.shape, step=7, salt=3, device=x.device)
    rounded = stochastic_round_to_bf16(x, noise).double()
    assert set(rounded.unique().tolist()) == {1.0, 1.0078125}
    assert rounded.mean().item() == pytest.approx(x[0].item(), abs=2**-7 * 0.01)
    # The same (step, salt) draws the same bits; another step draws others.
    assert torch.equal(noise, hash_noise16(x.shape, step=7, salt=3, device=x.device))
    assert not torch.equal(noise, hash_noise16(x.shape, step=8, salt=3, device=x.device))


@pytest.mark.parametrize("compensation", ["kahan", "stochastic", "none"])
def test_chunked_update_equals_the_whole_tensor_update(
    compensation: Compensation, monkeypatch: pytest.MonkeyPatch
) -> None:
    w0, grads = _problem()
    results = []
    for chunk in (BF16AdamW.chunk_elements, 1000):  # 4096 elements: 5 chunks, last short
        monkeypatch.setattr(BF16AdamW, "chunk_elements", chunk)
        p = nn.Parameter(w0.bfloat16().view(64, 64))
        opt = BF16AdamW([p], lr=LR, weight_decay=0.01, compensation=compensation)
        for grad in grads[:20]:
            p.grad = grad.bfloat16().view(64, 64)
            opt.step()
        results.append((p.detach().clone(), {k: v.clone() for k, v in opt.state[p].items()}))
    (p1, s1), (p2, s2) = results
    assert torch.equal(p1, p2)
    assert s1.keys() == s2.keys() and all(torch.equal(s1[k], s2[k]) for k in s1)
