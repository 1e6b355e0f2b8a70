"""The chunked log-prob head (grpo_trainer.algorithm.lean_logprobs): its log-probs, entropy and
gradients are the full logits' (float32: log-probs to the bit, the entropy within 1e-6
of its magnitude, gradients within 1e-6), and it holds what the planner counts
(planner/budget.py logprob_bytes) whatever the prompt's length.

The model-level comparisons (tiny Qwen2 and Qwen2.5-VL, padded and packed layouts,
LoRA, FSDP2) are in tests/trainer/test_lean_logprobs.py."""

from __future__ import annotations

import pytest
import torch

from grpo_api.model.shape import Shape
from grpo_operator.planner.sizes import logprob_bytes
from grpo_testkit.memory_census import LiveBytes
from grpo_trainer.algorithm.grpo_math import entropy_from_logits, log_probs_from_logits
from grpo_trainer.algorithm.lean_logprobs import ChunkedHead, full_logits_log_probs, lean_log_probs
from grpo_trainer.algorithm.samples import EncodedPrompt, Sample, collate_train
from grpo_trainer.data import Record

pytestmark = pytest.mark.unit

N, H, V, TEMPERATURE = 11, 32, 300, 0.7


def _inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(N, H, generator=gen).to(dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=gen) * 0.3).to(dtype).requires_grad_()
    labels = torch.randint(0, V, (N,), generator=gen)
    return hidden, weight, labels


def _full(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor
          ) -> tuple[torch.Tensor, torch.Tensor]:
    """The plain path on the same hidden states: the head's logits, then float32."""
    z = torch.nn.functional.linear(hidden, weight).float() / TEMPERATURE
    return log_probs_from_logits(z, labels), entropy_from_logits(z)


def _loss(logp: torch.Tensor, ent: torch.Tensor | None) -> torch.Tensor:
    w = torch.linspace(-1.0, 1.0, logp.numel())  # every token's gradient differs
    return (w * logp).sum() + (0.1 * ent.sum() if ent is not None else 0.0)


@pytest.mark.parametrize("chunk", [1, 4, N, 64])
@pytest.mark.parametrize("entropy_grad", [True, False])
def test_float32_log_probs_entropy_and_gradients_are_the_full_logits(
    chunk: int, entropy_grad: bool
) -> None:
    hidden, weight, labels = _inputs(torch.float32)
    out = ChunkedHead.apply(hidden, weight, labels, TEMPERATURE, chunk, True, entropy_grad)
    ent = out[:, 1] if entropy_grad else out[:, 1].detach()
    _loss(out[:, 0], ent).backward()
    grads = hidden.grad, weight.grad
    hidden.grad = weight.grad = None
    logp, full_ent = _full(hidden, weight, labels)
    _loss(logp, full_ent if entropy_grad else full_ent.detach()).backward()
    # The log-sum-exp in torch.logsumexp's order: the same bits but where a one-row
    # chunk reduces in another order. The entropy takes its expectation from the
    # max-shifted logits (the plain path from the logits: its own rounding is of their
    # size), so the two differ by a few float32 roundings of the value.
    torch.testing.assert_close(out[:, 0], logp, atol=1e-6, rtol=0)
    torch.testing.assert_close(out[:, 1], full_ent, atol=1e-6, rtol=1e-6)
    for got, want in zip(grads, (hidden.grad, weight.grad), strict=True):
        assert got is not None and want is not None
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_bf16_log_probs_are_exact_and_the_gradients_within_bf16_roundings() -> None:
    """In bf16 the head's logits are the plain path's to the bit (the same matmul per
    row), so log-probs and entropy agree to float32 rounding. The logits' gradient is
    rounded to bf16 from float32 values computed in another order, so the hidden
    states' gradient may differ by a bf16 rounding of it; the LM head's weight gradient
    is summed over chunks in bf16 (the plain path's one matmul is rounded once), each
    chunk adding at most one rounding (2^-8 of the running sum)."""
    hidden, weight, labels = _inputs(torch.bfloat16)
    chunks = 4
    out = ChunkedHead.apply(hidden, weight, labels, TEMPERATURE, -(-N // chunks), True, True)
    _loss(out[:, 0], out[:, 1]).backward()
    grads = hidden.grad, weight.grad
    hidden.grad = weight.grad = None
    logp, ent = _full(hidden, weight, labels)
    _loss(logp, ent).backward()
    torch.testing.assert_close(out[:, 0], logp, atol=1e-6, rtol=0)
    torch.testing.assert_close(out[:, 1], ent, atol=1e-6, rtol=1e-6)
    for got, want, bound in ((grads[0], hidden.grad, 2**-7), (grads[1], weight.grad,
                                                              chunks * 2**-8)):
        assert got is not None and want is not None
        err = (got.float() - want.float()).abs().max() / want.float().abs().max()
        assert err <= bound, (err, bound)


def test_without_a_gradient_for_it_the_entropy_column_takes_none() -> None:
    hidden, weight, labels = _inputs(torch.float32)
    out = ChunkedHead.apply(hidden, weight, labels, TEMPERATURE, 4, True, False)
    out.sum().backward()  # a gradient arrives for both columns: only the first counts
    with_metric = hidden.grad
    hidden.grad = None
    ChunkedHead.apply(hidden, weight, labels, TEMPERATURE, 4, False, False).sum().backward()
    assert with_metric is not None and hidden.grad is not None
    torch.testing.assert_close(with_metric, hidden.grad, atol=0, rtol=0)


def _shape() -> Shape:
    return Shape(parameters=1, vision_parameters=0, layers=1, hidden_size=H,
                 intermediate_size=H, attention_heads=1, kv_heads=1, head_dim=H, vocab_size=V)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("chunk", "entropy_grad"), [(3, True), (3, False), (64, True)])
def test_the_head_holds_the_planners_bytes_in_forward_and_backward(
    dtype: torch.dtype, chunk: int, entropy_grad: bool
) -> None:
    """Live bytes at the peak, counted as the plan-equals-tensors test counts them: the
    picked hidden states and labels, what forward makes; in backward the same, saved, and
    what it makes but the LM head's weight gradient (an FSDP2 buffer of the plan)."""
    hidden, weight, labels = _inputs(dtype)
    held = hidden.numel() * hidden.element_size() + labels.numel() * 8
    with LiveBytes() as fwd:
        out = ChunkedHead.apply(hidden, weight, labels, TEMPERATURE, chunk, True, entropy_grad)
    grad = torch.ones_like(out)
    with LiveBytes() as bwd:
        out.backward(grad)
    planned = logprob_bytes(_shape(), dtype.itemsize, chunk, N, trained_head=True)
    weight_grad = V * H * dtype.itemsize
    assert held + fwd.peak <= planned
    assert held + bwd.peak - weight_grad <= planned
    # Backward is the peak the planner counts, to the scalars of one chunk.
    assert planned - (held + bwd.peak - weight_grad) <= 16 * min(chunk, N)


def _tiny_qwen2() -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=V, hidden_size=H, intermediate_size=2 * H,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=2048)
    return Qwen2ForCausalLM(cfg)


def _head_peak(model: torch.nn.Module, prompt: int, lean: bool) -> int:
    """Live bytes from the decoder's output on (the head's forward and backward) for
    two samples of 6 response tokens after a ``prompt``-token prompt."""
    gen = torch.Generator().manual_seed(1)
    p = EncodedPrompt(Record(0, "", ""), torch.randint(10, V, (prompt,), generator=gen))
    batch = collate_train([Sample(p, torch.randint(10, V, (6,), generator=gen),
                                  torch.zeros(6), True) for _ in range(2)], 0)
    norm = model.model.norm
    live = LiveBytes()

    def start(*_: object) -> None:  # the head starts with the decoder's output
        live.__enter__()

    norm.register_forward_hook(start)
    path = lean_log_probs if lean else full_logits_log_probs
    kwargs = {"chunk": 4} if lean else {}
    try:
        out = path(model, batch.model_inputs, batch, temperature=TEMPERATURE, entropy=True,
                   entropy_grad=False, **kwargs)
        # Backward down to the decoder's output only: the head's own gradient.
        (out.logp * batch.response_mask).sum().backward(inputs=[model.lm_head.weight])
    finally:
        live.__exit__(None, None, None)
    return live.peak


def test_the_heads_memory_does_not_grow_with_the_prompt() -> None:
    """The chunked head: the same bytes after a 16- and a 512-token prompt. The full
    logits (the plain path) grow with the sequence."""
    model = _tiny_qwen2()
    short, long = _head_peak(model, 16, lean=True), _head_peak(model, 512, lean=True)
    # Besides the head: the per-token log-prob layout and the loss's inputs, 4 B a token.
    assert long - short <= 2 * 4 * (512 - 16) * 4
    full_short, full_long = _head_peak(model, 16, lean=False), _head_peak(model, 512, lean=False)
    assert full_long - full_short > 2 * (512 - 16) * V * 8
    assert long < full_long / 20
