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

Disaggregated rollout engines (rollout/engine_actor.py) on GPUs get the same environment
from the same source (``engine_env``: the vLLM switches, and the NCCL report of the weight
group, read after their first push), except NOSET: an engine apart runs vLLM's in-process
executor (TP 1, the only size apart), which binds ``cuda:<device index>`` where the index
is that of ``device_config.device``, and vLLM reduces that to a bare ``cuda`` (vLLM 0.32:
``v1/executor/uniproc_executor.py`` ``_distributed_args``, ``config/device.py``
``__post_init__``): an engine that saw every GPU of its node would run on GPU 0 whatever
Ray reserved for it. Under Ray's mask its one GPU is GPU 0.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Mapping
from pathlib import Path

import torch
import torch.distributed as dist

from grpo_api.trainer_config import Config, ResourcesConfig

from .collectives import VLLM_SWITCHES_OFF
from .nccl_log import parse_transport, summary

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


def _cuda_env(attempt: int, inherited: Mapping[str, str] | None, *, noset_cuda: bool
              ) -> dict[str, str]:
    """What a CUDA process of the job runs with (a rank's, an engine's). A name the
    pod's env already sets (spec.pods, the operator's Hang attempt's NCCL_DEBUG) keeps
    its value, except NCCL_DEBUG_FILE, without which the report cannot be read."""
    env = {NOSET_CUDA: "1"} if noset_cuda else {}
    env |= VLLM_SWITCHES_OFF
    if reports_transport(attempt):
        env |= NCCL_REPORT_ENV
    inherited = os.environ if inherited is None else inherited
    return {k: v for k, v in env.items() if k not in inherited or k == "NCCL_DEBUG_FILE"}


def rank_env(res: ResourcesConfig, attempt: int,
             inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """The env of a rank actor's process. CPU ranks (gloo, no vLLM CUDA paths) need
    none."""
    if not res.trains_on_cuda:
        return {}
    return _cuda_env(attempt, inherited, noset_cuda=True)


def engine_on_cuda(cfg: Config) -> bool:
    """Whether the engines apart generate on GPUs (not: test clusters' fake GPUs)."""
    dis = cfg.rollout.disaggregated
    return dis is not None and dis.gpus_per_engine > 0 and not cfg.resources.fake_gpus


def engine_env(cfg: Config, attempt: int,
               inherited: Mapping[str, str] | None = None) -> dict[str, str]:
    """The env of a disaggregated rollout engine's process: a rank's, without NOSET
    (the module's docstring says why); none for engines on the host."""
    if not engine_on_cuda(cfg):
        return {}
    return _cuda_env(attempt, inherited, noset_cuda=False)


def runtime_env(env: Mapping[str, str]) -> dict[str, object]:
    """``.options(...)`` giving an actor's process ``env`` (nothing when empty)."""
    return {"runtime_env": {"env_vars": dict(env)}} if env else {}


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
    return report_transport(f"rank {dist.get_rank()}")


def report_transport(who: str) -> dict[str, object] | None:
    """The transport NCCL chose, from this process's INIT/NET lines (once a
    communicator was built), logged as ``who``'s; None when not logged."""
    lines = own_nccl_log()
    if not lines:
        return None
    transport = parse_transport(lines)
    for line in transport.lines:
        log.info("%s: %s", who, line)
    log.info("%s: %s", who, summary(transport))
    return transport.to_dict()
