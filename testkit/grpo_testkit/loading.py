"""Model loading under measurement: random big checkpoints and per-rank load probes.

Shared by ``tests/trainer/test_sharded_loading.py`` and ``bench/bench_loading.py``.
Memory figures come from ``/proc/self/status``: ``VmHWM`` (peak resident set,
file-backed pages included) after resetting it through ``/proc/self/clear_refs``,
and a sampler for the peaks of ``RssAnon`` (private memory) and ``RssFile``
(mapped file pages, e.g. a memory-mapped safetensors file). Bytes fetched from
storage come from ``/proc/self/io`` ``read_bytes``, which counts page faults on
mapped files too; ``evict_page_cache`` makes a file cold for that purpose.

Those figures depend on the machine (page cache, read-ahead, fault-around): the
benchmark reports them. What a test asserts comes from ``recording_reads``, which
notes every byte range the loader asks safetensors for, and from ``/proc/self/io``
``rchar`` (bytes returned by ``read()`` calls, cached or not).
"""

from __future__ import annotations

import gc
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_CACHE = Path.home() / ".cache" / "grpo-operator" / "bench"


# -- /proc probes ---------------------------------------------------------------
def proc_status_bytes() -> dict[str, int]:
    """VmRSS, VmHWM, RssAnon, RssFile of this process in bytes."""
    keys = ("VmRSS", "VmHWM", "RssAnon", "RssFile")
    out: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            name = line.split(":", 1)[0]
            if name in keys:
                out[name] = int(line.split()[1]) * 1024
    return out


def reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def release_freed_memory() -> None:
    """Collect garbage and hand freed heap pages back to the kernel (glibc keeps them).

    Without this a load measured after another in the same process starts with
    the previous model's freed pages still resident, and its RSS rise looks smaller
    than what it really allocated.
    """
    import ctypes

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)


def read_bytes() -> int:
    """Bytes this process caused to be fetched from storage (page faults on mmaps too)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes")


def read_call_bytes() -> int:
    """Bytes this process got from ``read()``-like calls (page cache hits included)."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("rchar:"):
                return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no rchar")


def evict_page_cache(paths: list[Path]) -> None:
    """Drop these files' clean pages from the page cache (no root needed)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class PeakSampler:
    """Peaks of RssAnon and RssFile, sampled every ``interval_s`` in a thread."""

    def __init__(self, interval_s: float = 0.005) -> None:
        self.interval_s = interval_s
        self.peak_anon = 0
        self.peak_file = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        s = proc_status_bytes()
        self.peak_anon = max(self.peak_anon, s["RssAnon"])
        self.peak_file = max(self.peak_file, s["RssFile"])

    def _run(self) -> None:
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakSampler:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()


# -- which bytes of a checkpoint a loader reads -----------------------------------
@dataclass(frozen=True)
class FileRead:
    """One tensor read through safetensors: ``[start, end)`` bytes of ``file``."""

    file: str
    key: str
    start: int
    end: int


def _span(data_start: int, begin: int, end: int, shape: list[int], region: Any) -> tuple[int, int]:
    """File bytes of the rows a slice selects (whole rows: what a row-major read touches)."""
    rows = shape[0] if shape else 1
    first = region[0] if isinstance(region, tuple) and region else region
    lo, hi, _ = first.indices(rows) if isinstance(first, slice) else (0, rows, 1)
    row_bytes = (end - begin) // rows if rows else 0
    return data_start + begin + lo * row_bytes, data_start + begin + max(lo, hi) * row_bytes


class _RecordingSlice:
    def __init__(self, inner: Any, file: Path, key: str, reads: list[FileRead]) -> None:
        self._inner, self._file, self._key, self._reads = inner, file, key, reads

    def __getattr__(self, name: str) -> Any:  # get_shape, get_dtype
        return getattr(self._inner, name)

    def __getitem__(self, region: Any) -> Any:
        from grpo_trainer.model.sharded_load import safetensors_layout

        data_start, layout = safetensors_layout(self._file)
        begin, end, shape = layout[self._key]
        lo, hi = _span(data_start, begin, end, shape, region)
        self._reads.append(FileRead(self._file.name, self._key, lo, hi))
        return self._inner[region]


class _RecordingFile:
    def __init__(self, inner: Any, file: Path, reads: list[FileRead]) -> None:
        self._inner, self._file, self._reads = inner, file, reads

    def __enter__(self) -> _RecordingFile:
        self._inner.__enter__()
        return self

    def __exit__(self, *exc: object) -> Any:
        return self._inner.__exit__(*exc)

    def __getattr__(self, name: str) -> Any:  # keys, metadata
        return getattr(self._inner, name)

    def get_slice(self, key: str) -> _RecordingSlice:
        return _RecordingSlice(self._inner.get_slice(key), self._file, key, self._reads)

    def get_tensor(self, key: str) -> Any:
        from grpo_trainer.model.sharded_load import safetensors_layout

        data_start, layout = safetensors_layout(self._file)
        begin, end, _ = layout[key]
        self._reads.append(FileRead(self._file.name, key, data_start + begin, data_start + end))
        return self._inner.get_tensor(key)


@contextmanager
def recording_reads(reads: list[FileRead]) -> Iterator[None]:
    """Note in ``reads`` every tensor byte range read through ``safetensors.safe_open``."""
    import safetensors

    real = safetensors.safe_open

    def opener(filename: Any, framework: str, device: str = "cpu") -> _RecordingFile:
        inner = real(filename, framework=framework, device=device)
        return _RecordingFile(inner, Path(filename), reads)

    # The loader imports safe_open when it runs, so it gets the recording one.
    setattr(safetensors, "safe_open", opener)  # noqa: B010 (mypy: safe_open is a type)
    try:
        yield
    finally:
        setattr(safetensors, "safe_open", real)  # noqa: B010


# -- random checkpoints ---------------------------------------------------------
@dataclass(frozen=True)
class Qwen2Spec:
    hidden: int = 2048
    intermediate: int = 5632
    layers: int = 8
    vocab: int = 32000
    heads: int = 16
    kv_heads: int = 4
    files: int = 4
    dtype: str = "bfloat16"
    tie: bool = False
    seed: int = 0

    def tensors(self) -> list[tuple[str, tuple[int, ...]]]:
        """Checkpoint names and shapes, in Qwen2's on-disk layout."""
        h, kv = self.hidden, self.hidden // self.heads * self.kv_heads
        out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab, h))]
        for i in range(self.layers):
            p = f"model.layers.{i}."
            out += [
                (p + "input_layernorm.weight", (h,)),
                (p + "post_attention_layernorm.weight", (h,)),
                (p + "self_attn.q_proj.weight", (h, h)),
                (p + "self_attn.q_proj.bias", (h,)),
                (p + "self_attn.k_proj.weight", (kv, h)),
                (p + "self_attn.k_proj.bias", (kv,)),
                (p + "self_attn.v_proj.weight", (kv, h)),
                (p + "self_attn.v_proj.bias", (kv,)),
                (p + "self_attn.o_proj.weight", (h, h)),
                (p + "mlp.gate_proj.weight", (self.intermediate, h)),
                (p + "mlp.up_proj.weight", (self.intermediate, h)),
                (p + "mlp.down_proj.weight", (h, self.intermediate)),
            ]
        out.append(("model.norm.weight", (h,)))
        if not self.tie:
            out.append(("lm_head.weight", (self.vocab, h)))
        return out

    def numel(self) -> int:
        n = 0
        for _, shape in self.tensors():
            k = 1
            for d in shape:
                k *= d
            n += k
        return n


def write_random_qwen2(path: Path, spec: Qwen2Spec) -> Path:
    """A Qwen2ForCausalLM checkpoint with random weights in ``spec.files`` safetensors files."""
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen2Config

    path.mkdir(parents=True, exist_ok=True)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[spec.dtype]
    Qwen2Config(
        vocab_size=spec.vocab,
        hidden_size=spec.hidden,
        intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=spec.tie,
        dtype=spec.dtype,
    ).save_pretrained(path)
    names = spec.tensors()
    gen = torch.Generator().manual_seed(spec.seed)
    per_file = -(-len(names) // spec.files)
    weight_map: dict[str, str] = {}
    for i in range(spec.files):
        fname = f"model-{i + 1:05d}-of-{spec.files:05d}.safetensors"
        part = {}
        for name, shape in names[i * per_file : (i + 1) * per_file]:
            part[name] = (torch.randn(shape, generator=gen) * 0.02).to(dtype)
            weight_map[name] = fname
        save_file(part, str(path / fname), metadata={"format": "pt"})
    index = {"metadata": {"total_size": spec.numel() * dtype.itemsize}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    return path


def cached_random_qwen2(name: str, spec: Qwen2Spec, root: Path = BENCH_CACHE) -> Path:
    """``write_random_qwen2`` once per spec; later calls reuse the files."""
    path = root / name
    marker = path / "spec.json"
    want = json.dumps(spec.__dict__, sort_keys=True)
    if marker.exists() and marker.read_text() == want:
        return path
    write_random_qwen2(path, spec)
    marker.write_text(want)
    return path


def safetensors_files(path: Path) -> list[Path]:
    return sorted(path.glob("*.safetensors"))


# -- per-rank load probe ----------------------------------------------------------
@dataclass(frozen=True)
class LoadJob:
    model_dir: str
    strategies: tuple[str, ...]
    gather: bool = False  # rank 0 returns full parameters and buffers
    evict: bool = False  # make the files cold before each strategy
    record_reads: bool = False  # note the byte ranges read through safetensors


@dataclass
class LoadResult:
    strategy: str
    wall_s: float
    rss_before: int
    anon_before: int  # RssAnon before
    file_before: int  # RssFile before: shared libraries and other mapped files
    peak_rss: int  # VmHWM during the load (anon + file-backed)
    peak_anon: int
    peak_file: int
    rss_after: int
    read_bytes: int
    read_calls: int  # rchar: bytes from read() calls, page cache hits included
    local_numel: int
    params: dict[str, Any] = field(default_factory=dict)
    buffers: dict[str, Any] = field(default_factory=dict)
    reads: list[FileRead] = field(default_factory=list)


# Baselines a benchmark times in the same processes, right beside the loads: rank 0
# alone reads the files once ("read"), or fills fresh fp32 memory from them ("fill").
BASELINES = ("read", "fill")


def read_sequentially(files: list[Path]) -> None:
    for f in files:
        with open(f, "rb", buffering=0) as fh:
            while fh.read(16 * 2**20):
                pass


def fill_fp32(files: list[Path]) -> None:
    """What any strategy pays once over all ranks: fp32 weights are new memory."""
    import torch
    from safetensors import safe_open

    for f in files:
        with safe_open(f, framework="pt") as sf:
            for key in sf.keys():  # noqa: SIM118 (safe_open is not iterable)
                src = sf.get_tensor(key)  # a view of the mapped file
                torch.empty(src.shape, dtype=torch.float32).copy_(src)


def _load(strategy: str, rank: int, mcfg: Any, files: list[Path]) -> Any:
    import torch

    from grpo_api.trainer_config import ActorConfig
    from grpo_trainer.model.modeling import build_sharded

    if strategy in BASELINES:
        if rank == 0:
            (read_sequentially if strategy == "read" else fill_fp32)(files)
        return None
    actor = ActorConfig(init_strategy=strategy, dtype="float32")  # type: ignore[arg-type]
    return build_sharded(mcfg, actor, torch.device("cpu"), trainable=True)


def rank_load(rank: int, world: int, job: LoadJob) -> list[LoadResult]:
    """Load ``job.model_dir`` with each strategy in turn on this rank; measure each."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from grpo_api.trainer_config import ModelConfig

    torch.set_num_threads(1)
    mcfg = ModelConfig(path=job.model_dir)
    files = safetensors_files(Path(job.model_dir))
    results: list[LoadResult] = []
    for strategy in job.strategies:
        release_freed_memory()
        if job.evict and rank == 0:
            evict_page_cache(files)
        dist.barrier()
        before = proc_status_bytes()
        reset_peak_rss()
        io0, calls0 = read_bytes(), read_call_bytes()
        reads: list[FileRead] = []
        t0 = time.perf_counter()
        with PeakSampler() as peaks:
            with recording_reads(reads) if job.record_reads else nullcontext():
                model = _load(strategy, rank, mcfg, files)
            dist.barrier()
        wall = time.perf_counter() - t0
        status = proc_status_bytes()
        params = list(model.parameters()) if model is not None else []
        local = sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in params)
        res = LoadResult(
            strategy,
            wall,
            before["VmRSS"],
            before["RssAnon"],
            before["RssFile"],
            status["VmHWM"],
            peaks.peak_anon,
            peaks.peak_file,
            status["VmRSS"],
            read_bytes() - io0,
            read_call_bytes() - calls0,
            local,
            reads=reads,
        )
        if job.gather and model is not None:
            for name, p in model.named_parameters():
                full = p.full_tensor() if isinstance(p, DTensor) else p.detach()
                if rank == 0:
                    res.params[name] = full.detach().clone()
            if rank == 0:
                res.buffers = {n: b.detach().clone() for n, b in model.named_buffers()}
        results.append(res)
        del model
        release_freed_memory()
    return results


def save_variant(src: Path, dst: Path, *, tie: bool, dtype: str, odd: bool = False) -> Path:
    """Re-save a tiny model with tied embeddings and/or another file dtype (random weights).

    ``odd`` gives the vocabulary and the MLP odd sizes, so FSDP's row chunks are uneven.
    """
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    cfg = AutoConfig.from_pretrained(src)
    cfg.tie_word_embeddings = tie
    if odd:
        cfg.vocab_size += 1 - cfg.vocab_size % 2
        cfg.intermediate_size += 1 - cfg.intermediate_size % 2
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(cfg, dtype=getattr(torch, dtype))
    model.save_pretrained(dst)
    AutoTokenizer.from_pretrained(src).save_pretrained(dst)
    return dst


def rank_load_many(rank: int, world: int, jobs: list[LoadJob]) -> list[list[LoadResult]]:
    """``rank_load`` for several jobs in one set of processes (spawning costs seconds)."""
    return [rank_load(rank, world, job) for job in jobs]
