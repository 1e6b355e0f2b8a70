"""The environment of a rank's process: what must hold before it loads CUDA, NCCL or
vLLM, so it goes into the rank actor's Ray ``runtime_env`` (the driver sets it).

- ``RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1``: Ray leaves CUDA_VISIBLE_DEVICES
  alone (ray 2.60 ``_private/accelerators/nvidia_gpu.py``: it returns before setting
  it), so each rank sees every GPU of its node and binds the one Ray reserved for it
  explicitly (worker.py: ``torch.cuda.set_device`` before its process group starts).
  A process that sees one masked GPU is a known source of NCCL trouble on NVSwitch
  nodes (slow first collectives, NVLS rank corruption, hangs of large all-reduces:
  NVIDIA/nccl#1749 and #1906, NeMo-RL#1963, ray#61073); NeMo-RL runs the same way.
- vLLM's FlashInfer and symmetric-memory switches off (rollout/collectives.py says why).
- On the first attempt, NCCL's INIT/NET lines to a file of the rank's own, which the
  rank reads after its first collective to report the transport NCCL chose (nccl_log.py).
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist

from grpo_api.trainer_config import ResourcesConfig

from .nccl_log import parse_transport, summary
from .rollout.collectives import VLLM_SWITCHES_OFF

log = logging.getLogger(__name__)

NOSET_CUDA = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
# In the worker pod, not on the checkpoint claim: each rank reads only its own file.
NCCL_LOG_DIR = "/tmp/grpo-nccl"
# %h and %p: NCCL writes the host name and the process id there (its debug.cc).
NCCL_LOG_FILE = f"{NCCL_LOG_DIR}/nccl.%h.%p.log"
NCCL_REPORT_ENV = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET",
                   "NCCL_DEBUG_FILE": NCCL_LOG_FILE}


def reports_transport(attempt: int) -> bool:
    """Whether this attempt's ranks log NCCL's INIT/NET lines to read the transport: the
    first only (INFO costs log volume on every communicator; the fabric does not change
    between attempts, and the operator keeps the first attempt's report)."""
    return attempt == 0


def rank_env(res: ResourcesConfig, attempt: int,
             inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """The env of a rank actor's process. CPU ranks (gloo, no vLLM CUDA paths) need
    none. A name the pod's env already sets (spec.pods, the operator's Hang attempt's
    NCCL_DEBUG) keeps its value, except NCCL_DEBUG_FILE, without which the report
    cannot be read."""
    if not res.trains_on_cuda:
        return {}
    env = {NOSET_CUDA: "1", **VLLM_SWITCHES_OFF}
    if reports_transport(attempt):
        env |= NCCL_REPORT_ENV
    inherited = os.environ if inherited is None else inherited
    return {k: v for k, v in env.items() if k not in inherited or k == "NCCL_DEBUG_FILE"}


def own_nccl_log(pid: int | None = None, log_dir: str = NCCL_LOG_DIR) -> list[str]:
    """The lines NCCL wrote to this process's debug file (none without one)."""
    pid = os.getpid() if pid is None else pid
    lines: list[str] = []
    for path in sorted(glob.glob(f"{glob.escape(log_dir)}/nccl.*.{pid}.log")):
        lines += Path(path).read_text(errors="replace").splitlines()
    return lines


def first_collective(device: torch.device) -> dict[str, object] | None:
    """On a CUDA rank, one NCCL all-reduce right after the process group starts: NCCL
    builds its communicator there, so a network NCCL_NET names but cannot reach fails
    now, before the model loads, with NCCL's `Error: network IB not found.`. Then the
    transport NCCL chose, from its INIT/NET lines (the first attempt writes them to a
    file of this process, rank_env.py), which the rank also logs; None when not logged."""
    if device.type != "cuda":
        return None
    dist.all_reduce(torch.ones(1, device=device))
    torch.cuda.synchronize(device)
    lines = own_nccl_log()
    if not lines:
        return None
    transport = parse_transport(lines)
    for line in transport.lines:
        log.info("rank %d: %s", dist.get_rank(), line)
    log.info("rank %d: %s", dist.get_rank(), summary(transport))
    return transport.to_dict()
