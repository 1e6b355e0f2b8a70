"""How vLLM's tensor-parallel all-reduce runs on the trainer's ranks (pure decisions;
each checked against vLLM 0.32.0's source, as installed, which CPU tests cannot run).

Ranks run with RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1 (rank_env.py): each sees
every GPU of its node, bound to its own with ``torch.cuda.set_device``.

- **Custom all-reduce: on when the rank sees its TP peers' GPUs.** It was off because
  under Ray's masking a rank sees one GPU: ``CustomAllreduce`` checks P2P between the
  group's local ids through a cache keyed by the visible devices
  (``distributed/device_communicators/all_reduce_utils.py:344-366``, ``device_count()``
  entries) and opens CUDA IPC handles of its peers' buffers
  (``custom_all_reduce.py:297-314``), neither possible with one visible device. With
  every GPU visible, ``visible_device_id_to_physical_device_id`` is the identity
  (``platforms/interface.py:352-354``), the P2P cache covers every pair, and
  ``is_fully_connected`` sees the NVSwitch (``custom_all_reduce.py:255-269``); it then
  takes the small, latency-bound decode all-reduces (up to 8 MiB) and leaves larger
  ones to NCCL. Its buffers are ``cudaMalloc``'d outside vLLM's sleep pool, so a level-2
  sleep keeps them (tens of MiB).
- **FlashInfer all-reduce and FlashInfer sampler: off.** Both default on
  (``envs.py``: VLLM_ALLREDUCE_USE_FLASHINFER, VLLM_USE_FLASHINFER_SAMPLER) and run
  FlashInfer kernels that the image's lock does not carry precompiled: it has
  flashinfer-python 0.7.0.post1 without flashinfer-cubin or flashinfer-jit-cache (PyPI
  serves flashinfer-cubin only up to 0.6.x, which vLLM refuses for another version; the
  JIT cache is not on PyPI), so FlashInfer would compile with nvcc or download cubins at
  engine start, in pods without egress. (vLLM 0.32's ``has_flashinfer`` turns them off by
  itself only while no nvcc is found: ``utils/flashinfer.py:88-106``.)
- **Torch symmetric-memory all-reduce: off.** VLLM_ALLREDUCE_USE_SYMM_MEM (default on)
  builds a multicast object across the TP group's GPUs (``symm_mem.py``: disabled when
  ``multicast_ptr == 0``), i.e. NVLS, the NVSwitch multicast path implicated in
  NVIDIA/nccl#1749; with custom all-reduce on, one IPC all-reduce path is enough and
  NCCL takes the rest. ``disable_custom_all_reduce`` alone leaves both switches on
  (``cuda_communicator.py:64-74`` reads them independently).
"""

from __future__ import annotations

import os

VLLM_SWITCHES_OFF = {
    "VLLM_ALLREDUCE_USE_FLASHINFER": "0",
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_ALLREDUCE_USE_SYMM_MEM": "0",
}


def custom_all_reduce(on_cpu: bool, tensor_parallel: int, visible_gpus: int) -> bool:
    """Whether vLLM's custom all-reduce may run: CUDA, TP >= 2, and the process sees at
    least the TP group's GPUs (Ray left CUDA_VISIBLE_DEVICES alone); the CPU build has no
    custom kernel."""
    return not on_cpu and tensor_parallel > 1 and visible_gpus >= tensor_parallel


def collective_kwargs(on_cpu: bool, tensor_parallel: int) -> dict[str, bool]:
    """``vllm.LLM``'s all-reduce argument for this process (reads torch's device count)."""
    visible = 0
    if not on_cpu:
        import torch

        visible = torch.cuda.device_count()
    return {"disable_custom_all_reduce": not custom_all_reduce(on_cpu, tensor_parallel,
                                                               visible)}


def restore_local_rank(trainer_local_rank: str | None) -> None:
    """Put the trainer's LOCAL_RANK (the rank's place on its node) back once vLLM has
    started. vLLM's external launcher reads LOCAL_RANK as the CUDA device to bind
    (``v1/worker/gpu_worker.py:496-500``), so the engine is started with the device
    index; after that vLLM keeps its own (``parallel_state._WORLD.local_rank``)."""
    if trainer_local_rank is None:
        os.environ.pop("LOCAL_RANK", None)
    else:
        os.environ["LOCAL_RANK"] = trainer_local_rank
