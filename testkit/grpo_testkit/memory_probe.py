"""Where a rank's memory goes, measured: bytes of tensors by role, and peaks over time.

Shared by ``bench/gpu_fidelity.py`` (through ``grpo_testkit/fidelity.py``). On CUDA the
peaks are the caching allocator's (``max_memory_allocated`` / ``max_memory_reserved``,
reset at each mark), the memory outside it (CUDA context, NCCL, cuBLAS workspaces) is
what the driver reports in use minus what the allocator reserved, and ``nvidia-smi``
is polled in a thread for the device-level peak (samples 0.1 s apart: a spike
shorter than that can slip between two). On a CPU there are no allocator
statistics: a mark counts the bytes of the live tensors Python can see (storages,
each once), which misses tensors held only inside autograd or C++, so it is a floor,
not a peak. Every mark also has this process's RSS (now, and its sampled peak since the
previous mark) and, on CUDA, torch's pinned host allocator's statistics.
"""

from __future__ import annotations

import gc
import shutil
import subprocess
import threading
import time
import warnings
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn


def storage_bytes(tensors: Iterable[torch.Tensor]) -> dict[str, int]:
    """Bytes of the storages behind ``tensors`` (a DTensor by its local shard), each
    storage once, by device type ("cuda", "cpu")."""
    from torch.distributed.tensor import DTensor

    seen: set[tuple[str, int]] = set()
    out: dict[str, int] = {}
    for t in tensors:
        local = t.to_local() if isinstance(t, DTensor) else t
        if local.is_meta:
            continue
        storage = local.untyped_storage()
        key = (local.device.type, storage.data_ptr())
        if key in seen or storage.data_ptr() == 0:
            continue
        seen.add(key)
        out[local.device.type] = out.get(local.device.type, 0) + storage.nbytes()
    return out


def param_bytes(model: nn.Module, trainable: bool) -> dict[str, int]:
    """The stored (sharded) parameters that train, or those that are frozen."""
    return storage_bytes(p for p in model.parameters() if p.requires_grad == trainable)


def grad_bytes(model: nn.Module) -> dict[str, int]:
    """The gradients the optimizer is about to read (sharded, as FSDP2 leaves them)."""
    return storage_bytes(p.grad for p in model.parameters() if p.grad is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Every tensor of the optimizer's state (moments, Kahan compensation, steps)."""
    return storage_bytes(
        v for state in optimizer.state.values() for v in state.values()
        if isinstance(v, torch.Tensor)
    )


def live_tensor_bytes(device_type: str) -> int:
    """Bytes of every live tensor storage Python can reach on ``device_type``."""
    from torch.distributed.tensor import DTensor

    found: list[torch.Tensor] = []
    with warnings.catch_warnings():  # isinstance on deprecated module attributes warns
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor) and not isinstance(obj, DTensor):
                    found.append(obj)
            except Exception:  # a dead weakref proxy, an object whose __class__ raises
                continue
    live = [t for t in found if t.device.type == device_type]
    return storage_bytes(live).get(device_type, 0)


class _Poller:
    """A figure sampled every ``interval_s`` in a thread, and its peak between two times."""

    def __init__(self, interval_s: float) -> None:
        self.samples: list[tuple[float, int]] = []
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> int | None:
        raise NotImplementedError

    def _run(self) -> None:
        while not self._stop.is_set():
            value = self._sample()
            if value is not None:
                self.samples.append((time.monotonic(), value))
            self._stop.wait(self._interval_s)

    def peak(self, since: float, until: float) -> int | None:
        inside = [b for t, b in self.samples if since <= t <= until]
        return max(inside) if inside else None

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)


class HostPoller(_Poller):
    """This process's resident set (RSS): the host figure the planner's host terms promise
    (offloaded state, pinned blocks, the rank's libraries), sampled like the device's."""

    def __init__(self, interval_s: float = 0.1) -> None:
        import psutil

        super().__init__(interval_s)
        self._process = psutil.Process()
        self._thread.start()

    def rss(self) -> int:
        return int(self._process.memory_info().rss)

    def _sample(self) -> int | None:
        return self.rss()


PINNED_KEYS = ("allocated_bytes.current", "allocated_bytes.peak", "active_bytes.current",
               "num_host_alloc", "num_host_free", "host_alloc_time.total",
               "host_free_time.total")


def pinned_stats() -> dict[str, float]:
    """torch's pinned host allocator: bytes it holds (blocks as it sized them: rounded
    below its limits), at most since the last reset, and its cudaHostAlloc/Free counts
    and microseconds (what exact, uncached blocks cost; planner/pinned.py). Empty where
    torch has no such statistics (older torch, no CUDA)."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if stats is None or not torch.cuda.is_initialized():
        return {}
    got = stats()
    return {k: float(got[k]) for k in PINNED_KEYS if k in got}


class DevicePoller(_Poller):
    """``nvidia-smi``'s memory.used for one GPU, every ``interval_s``, in a thread.

    The device-level figure: everything on the GPU (context, NCCL, allocator pools,
    other processes). One short ``nvidia-smi`` call per sample rather than its loop
    mode, so that nothing outlives a case killed at its time limit. ``available`` is
    False where there is no ``nvidia-smi``.
    """

    def __init__(self, gpu_uuid: str, interval_s: float = 0.1) -> None:
        super().__init__(interval_s)
        self._exe = shutil.which("nvidia-smi")
        uuid = gpu_uuid if gpu_uuid.startswith("GPU-") else f"GPU-{gpu_uuid}"
        self._args = ["--query-gpu=memory.used", "--format=csv,noheader,nounits", f"--id={uuid}"]
        if self._exe is not None:
            self._thread.start()

    @property
    def available(self) -> bool:
        return self._exe is not None

    def _sample(self) -> int | None:
        assert self._exe is not None
        res = subprocess.run([self._exe, *self._args], capture_output=True, text=True,
                             timeout=30)
        try:
            mib = float(res.stdout.strip())
        except ValueError:  # "[N/A]", or an error
            return None
        return int(mib * 2**20) if mib >= 0 else None


def gpu_identity(device: torch.device) -> dict[str, Any]:
    """Name, memory, driver and library versions of the GPU ``device`` is."""
    props = torch.cuda.get_device_properties(device)
    out: dict[str, Any] = {
        "name": props.name,
        "total_bytes": int(props.total_memory),
        "uuid": str(props.uuid),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
    }
    exe = shutil.which("nvidia-smi")
    if exe is not None:
        uuid = out["uuid"] if out["uuid"].startswith("GPU-") else f"GPU-{out['uuid']}"
        res = subprocess.run(
            [exe, "--query-gpu=driver_version,memory.total", "--format=csv,noheader",
             f"--id={uuid}"],
            capture_output=True, text=True, timeout=30,
        )
        if res.returncode == 0 and res.stdout.strip():
            driver, total = (s.strip() for s in res.stdout.strip().split(",", 1))
            out |= {"driver": driver, "nvidia_smi_total": total}
    return out


@dataclass
class Mark:
    """Memory at one named point, and the peaks since the previous mark."""

    name: str
    t: float  # seconds since the probe started
    allocated: int
    peak_allocated: int  # since the previous mark (cuda); = allocated on cpu
    reserved: int | None = None
    peak_reserved: int | None = None
    non_torch: int | None = None  # in use on the device but not reserved by torch
    device_peak: int | None = None  # nvidia-smi, since the previous mark
    host_rss: int | None = None  # this process's resident set now
    host_peak_rss: int | None = None  # ...and its peak since the previous mark (sampled)
    pinned: dict[str, float] = field(default_factory=dict)  # pinned_stats() (cuda)
    extra: dict[str, Any] = field(default_factory=dict)


class MemoryProbe:
    """Marks on one device: CUDA allocator statistics and nvidia-smi, or live tensors."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.t0 = time.monotonic()
        self._last = self.t0
        self.marks: list[Mark] = []
        self.poller: DevicePoller | None = None
        if self.cuda:
            self.poller = DevicePoller(str(torch.cuda.get_device_properties(device).uuid))
        self.host = HostPoller()

    def mark(self, name: str, **extra: Any) -> Mark:
        now = time.monotonic()
        if self.cuda:
            torch.cuda.synchronize(self.device)
            free, total = torch.cuda.mem_get_info(self.device)
            reserved = torch.cuda.memory_reserved(self.device)
            m = Mark(
                name,
                now - self.t0,
                allocated=torch.cuda.memory_allocated(self.device),
                peak_allocated=torch.cuda.max_memory_allocated(self.device),
                reserved=reserved,
                peak_reserved=torch.cuda.max_memory_reserved(self.device),
                non_torch=(total - free) - reserved,
                device_peak=self.poller.peak(self._last, now) if self.poller else None,
                extra=extra,
            )
            m.pinned = pinned_stats()
            torch.cuda.reset_peak_memory_stats(self.device)
            if m.pinned and hasattr(torch.cuda, "reset_peak_host_memory_stats"):
                torch.cuda.reset_peak_host_memory_stats()
        else:
            live = live_tensor_bytes("cpu")
            m = Mark(name, now - self.t0, allocated=live, peak_allocated=live, extra=extra)
        m.host_rss = self.host.rss()
        m.host_peak_rss = max(self.host.peak(self._last, now) or 0, m.host_rss)
        self._last = now
        self.marks.append(m)
        return m

    def stop(self) -> None:
        if self.poller is not None:
            self.poller.stop()
        self.host.stop()

    def to_json(self) -> list[dict[str, Any]]:
        return [asdict(m) for m in self.marks]
