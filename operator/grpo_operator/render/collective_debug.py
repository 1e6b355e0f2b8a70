"""The collective debug env of the attempt after a Hang: what torch 2.13 and NCCL read
to say where a collective is stuck, set on that one attempt only (its ring buffer and
NCCL's log lines cost time and log volume on every step)."""

from __future__ import annotations

from grpo_api.contract import STALLS_DIR

from . import names
from .names import JobRef

# Names as torch 2.13 reads them (c10d ProcessGroupNCCL.hpp, FlightRecorder.hpp,
# libtorch's TORCH_FR_DUMP_TEMP_FILE) and NCCL documents them.
COLLECTIVE_DEBUG = {
    # The flight recorder's ring buffer (0 = off in the NCCL process group): the last
    # collectives of every process group, with their sequence numbers and state.
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "20000",
    # On the NCCL watchdog's timeout, every rank dumps that buffer (needs the buffer and
    # the monitoring thread, which torch enables by default; set so a user's 0 is seen).
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
    "TORCH_NCCL_ENABLE_MONITORING": "1",
    # NCCL's own log: INFO for communicator setup and transport/network errors only
    # (COLL would log every collective of every step).
    "NCCL_DEBUG": "INFO",
    "NCCL_DEBUG_SUBSYS": "INIT,NET",
}
FLIGHT_RECORDER_FILE = "TORCH_FR_DUMP_TEMP_FILE"  # a prefix: torch appends the rank


def collective_debug_env(job: JobRef, attempt: int, user_env: set[str]) -> dict[str, str]:
    """The env above, with the dumps on the checkpoint claim next to the trainer's stacks
    of this attempt (a pod's /tmp goes with the pod); a name the user set in spec.pods
    keeps the user's value."""
    stalls = f"{names.attempt_logs_dir(job, attempt)}/{STALLS_DIR}"
    env = {**COLLECTIVE_DEBUG, FLIGHT_RECORDER_FILE: f"{stalls}/nccl-trace-rank-"}
    return {k: v for k, v in env.items() if k not in user_env}
