"""Exit-code classification and the termination message."""

from __future__ import annotations

import json

import pytest

from grpo_api.contract import TERMINATION_MESSAGE_MAX_BYTES, ExitCode, FailureReason
from grpo_trainer.config import ConfigError
from grpo_trainer.errors import StepError, classify, parse_fault, step_of, termination_message

pytestmark = pytest.mark.unit


def test_cuda_oom_text_anywhere_in_the_chain_is_exit_3() -> None:
    inner = RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")
    wrapped = StepError(812, RuntimeError("worker failed"))
    wrapped.__cause__ = inner
    c = classify(StepError(812, inner))
    assert c.code == ExitCode.CUDA_OOM and c.reason == FailureReason.CUDA_OOM
    assert step_of(StepError(812, inner)) == 812


def test_other_classes() -> None:
    assert classify(ConfigError("a.b", "bad")).code == ExitCode.CONFIG_ERROR
    assert classify(MemoryError()).code == ExitCode.HOST_OOM
    assert classify(ValueError("x")).code == ExitCode.ERROR


def test_termination_message_fits_the_limit() -> None:
    msg = termination_message(FailureReason.CUDA_OOM, 812, 800, "x" * 10_000 + "END")
    assert len(msg.encode()) <= TERMINATION_MESSAGE_MAX_BYTES
    body = json.loads(msg)
    assert body["reason"] == "CudaOOM" and body["step"] == 812 and body["lastCheckpointStep"] == 800
    assert body["detail"].endswith("END")


def test_fault_spec_parsing() -> None:
    assert parse_fault("cuda_oom@step=2") == ("cuda_oom", 2)
    assert parse_fault(None) is None
    with pytest.raises(ConfigError):
        parse_fault("meteor@step=2")


def test_a_collective_that_lost_its_peer_is_a_lost_worker() -> None:
    """What a surviving rank raises when another rank's node dies mid-step (gloo, NCCL)."""
    from grpo_trainer.errors import StepError

    for text in (
        "[../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:50073. "
        "This is typically caused by a remote worker crashing.",
        "NCCL error: remote process exited or there was a network error",
    ):
        c = classify(StepError(2, RuntimeError(text)))
        assert (c.code, c.reason) == (ExitCode.WORKER_LOST, FailureReason.NODE_LOST), text
    c = classify(StepError(2, RuntimeError("shape mismatch")))
    assert (c.code, c.reason) == (ExitCode.ERROR, FailureReason.ERROR)
