"""Map failures to the contract's exit codes (liveness/termination.py writes the message).

The operator decides how to remediate from the exit code and the JSON message
in the termination log, so the classification must see through Ray's wrappers:
a CUDA OOM inside a worker reaches the driver as a ``RayTaskError`` whose cause
is the ``torch.OutOfMemoryError``.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from grpo_api.contract import ExitCode, FailureReason, RankStage

from .config_error import ConfigError
from .liveness.rank_crash import RankCrashed
from .liveness.sigterm import Terminated
from .liveness.stall import StallError

log = logging.getLogger(__name__)


class CheckpointIncompatible(Exception):
    """A checkpoint that is intact but cannot be loaded under this run's settings
    (exit 7, ``CheckpointIncompatible``; checkpointing/compat.py decides): its message
    names the checkpoint's step, the keys and why, and what to do. One message argument,
    so Ray pickles it as it is."""


CUDA_OOM_TEXT = "CUDA out of memory"
# vLLM's KV cache at start-up (v1/core/kv_cache_utils.py, _check_enough_kv_cache_memory):
# its weights and activations leave nothing of rollout.gpu_memory_utilization x card, or
# less than one max_model_len sequence needs. A CudaOOM of its own rank stage (KV_CACHE):
# vLLM's own advice is a higher utilisation, the opposite of the rollout OOM's remedy.
KV_CACHE_WORDINGS = (
    re.compile(r"No available memory for the cache blocks"),
    re.compile(r"KV cache is needed, which is larger than the available KV cache memory"),
)
# Every wording in which a GPU run's out-of-memory reaches the driver, read from the pinned
# libraries' sources and binaries (docs/trainer.md "CUDA path"). Each is CudaOOM (exit 3),
# so the operator's CudaOOM ladder runs instead of a plain restart.
CUDA_OOM_WORDINGS = (
    # torch's caching allocator (torch.OutOfMemoryError), also as text in a traceback.
    re.compile(re.escape(CUDA_OOM_TEXT)),
    re.compile(r"OutOfMemoryError: CUDA"),
    # torch's CUDA checks ("CUDA error: out of memory": cudaErrorMemoryAllocation outside
    # the allocator) and vLLM's sleep-mode pool ("CUDA Error: out of memory at
    # .../cumem_allocator.cpp:N" when a wake-up or an allocation cannot map its memory).
    re.compile(r"CUDA error: out of memory", re.IGNORECASE),
    # vLLM's start-up check: less free memory than rollout.gpu_memory_utilization x card.
    re.compile(r"Free memory on device \S+ \(.*\) on startup is less than"),
    # NCCL's own CUDA allocations, as torch's DistBackendError reports NCCL's last error.
    re.compile(r"Cuda failure (\d+ )?'out of memory'"),
    # cuBLAS could not allocate its handle or workspace.
    re.compile(r"CUBLAS_STATUS_ALLOC_FAILED"),
    *KV_CACHE_WORDINGS,
)


@dataclass(frozen=True)
class Classified:
    code: ExitCode
    reason: FailureReason
    detail: str
    stage: RankStage | None = None  # what the failing rank was doing (`rank_stage`)


_STAGE_ATTR = "grpo_rank_stage"


@contextmanager
def rank_stage(stage: RankStage) -> Iterator[None]:
    """Tag an exception that leaves the block with what the rank was doing, so that the
    operator's ladder relieves that stage first (contract.RankStage). A tag, not a
    wrapper: the exception keeps its type, and Ray pickles it with its attributes into
    the RayTaskError the driver sees. The innermost tag wins."""
    try:
        yield
    except BaseException as exc:
        if getattr(exc, _STAGE_ATTR, None) is None:
            with contextlib.suppress(AttributeError, TypeError):
                setattr(exc, _STAGE_ATTR, stage.value)
        raise


def stage_of(exc: BaseException) -> RankStage | None:
    """The stage the innermost tagged exception in ``exc``'s chain was raised in."""
    tags = [str(getattr(e, _STAGE_ATTR, "")) for e in _chain(exc)]
    found = [RankStage(t) for t in tags if t in RankStage.__members__.values()]
    return found[-1] if found else None


class StepError(RuntimeError):
    """A failure annotated with the training step it happened at."""

    def __init__(self, step: int, cause: BaseException) -> None:
        super().__init__(f"step {step}: {cause}")
        self.step = step
        self.cause = cause


class WorkersMissingError(RuntimeError):
    """Not every node's ranks could be placed within ``resources.gang_timeout_s``: worker
    pods that never came up (or nodes too small). The message says how many nodes
    joined and what Ray sees (``placement.missing_detail``)."""


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in seen:
        seen.append(cur)
        nxt = getattr(cur, "cause", None)  # RayTaskError / StepError
        if not isinstance(nxt, BaseException):
            nxt = cur.__cause__ or cur.__context__
        cur = nxt
    return seen


_RAY_MEMORY_KILL = "running low on memory"  # Ray's memory monitor's wording
# A surviving rank's collective when a peer's process is gone (gloo; NCCL's wording).
PEER_LOST_TEXTS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "remote process exited",
)


def is_peer_loss(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective failing because another rank's process died."""
    return any(t in str(e) for e in _chain(exc) for t in PEER_LOST_TEXTS)


def _is_cuda_oom(exc: BaseException) -> bool:
    try:
        import torch

        if isinstance(exc, torch.OutOfMemoryError):
            return True
    except ImportError:  # the operator side imports this module without torch
        pass
    text = str(exc)
    return any(w.search(text) for w in CUDA_OOM_WORDINGS)


def classify(exc: BaseException) -> Classified:
    """Exit code + reason for an exception raised anywhere in the driver."""
    chain = _chain(exc)
    detail = f"{type(chain[-1]).__name__}: {chain[-1]}"
    if any(isinstance(e, ConfigError) for e in chain):
        return Classified(ExitCode.CONFIG_ERROR, FailureReason.CONFIG_ERROR, detail)
    # Raised on a rank while loading; its message is the whole detail (step, keys, advice).
    # The innermost: Ray's wrapper is an instance of the cause's class too, and its text
    # starts with the actor's repr and the traceback.
    if bad := next((e for e in reversed(chain) if isinstance(e, CheckpointIncompatible)), None):
        return Classified(ExitCode.CHECKPOINT_INCOMPATIBLE, FailureReason.CHECKPOINT_INCOMPATIBLE,
                          str(bad))
    # Before the lost-rank classes: killing the ranks of a stalled run is our own doing.
    if stall := next((e for e in chain if isinstance(e, StallError)), None):
        return Classified(ExitCode.HANG, FailureReason.HANG, str(stall))
    if stop := next((e for e in chain if isinstance(e, Terminated)), None):
        return Classified(ExitCode.TERMINATED, FailureReason.TERMINATED, str(stop))
    # Before Ray's dead-actor classes: the rank's own dump says it crashed (a collective
    # mismatch, a segfault), which a retry as a lost node would not cure.
    if crash := next((e for e in chain if isinstance(e, RankCrashed)), None):
        return Classified(ExitCode.ERROR, FailureReason.ERROR, str(crash))
    if any(isinstance(e, WorkersMissingError) for e in chain):
        return Classified(ExitCode.WORKER_LOST, FailureReason.WORKERS_MISSING, detail)
    if any(_is_cuda_oom(e) for e in chain):
        # vLLM's KV-cache shortage wants the opposite of every other CUDA OOM's remedy.
        short = any(w.search(str(e)) for e in chain for w in KV_CACHE_WORDINGS)
        stage = RankStage.KV_CACHE if short else stage_of(exc)
        return Classified(ExitCode.CUDA_OOM, FailureReason.CUDA_OOM, detail, stage)
    try:
        from ray import exceptions as rex
    except ImportError:
        rex = None  # type: ignore[assignment]
    if rex is not None:
        if any(isinstance(e, rex.OutOfMemoryError) for e in chain):
            return Classified(ExitCode.HOST_OOM, FailureReason.RAY_OOM, detail)
        lost = (rex.RayActorError, rex.NodeDiedError, rex.WorkerCrashedError)
        # An actor that Ray's memory monitor killed surfaces as a dead actor whose
        # message says so: that is a host-memory problem (RayOOM), not a lost node.
        if any(isinstance(e, lost) and _RAY_MEMORY_KILL in str(e) for e in chain):
            return Classified(ExitCode.HOST_OOM, FailureReason.RAY_OOM, detail)
        if any(isinstance(e, lost) for e in chain):
            return Classified(ExitCode.WORKER_LOST, FailureReason.NODE_LOST, detail)
    # Only a survivor's side of a lost rank reached the driver (the dead rank's own error
    # had not arrived within the driver's grace): still a lost worker.
    if is_peer_loss(exc):
        return Classified(ExitCode.WORKER_LOST, FailureReason.NODE_LOST, detail)
    if any(isinstance(e, MemoryError) for e in chain):
        return Classified(ExitCode.HOST_OOM, FailureReason.HOST_OOM, detail)
    return Classified(ExitCode.ERROR, FailureReason.ERROR, detail)


def step_of(exc: BaseException) -> int | None:
    for e in _chain(exc):
        if isinstance(e, StepError):
            return e.step
    return None
