"""Sharded init: every rank reads only the bytes of its own FSDP shards from safetensors.

The model is built with its parameters on the meta device (buffers real, so the
non-persistent ones such as rotary ``inv_freq`` are computed exactly as in
``__init__``), sharded with ``fully_shard``, materialised empty, and then each
rank copies ``file[rows of its chunk]`` into its local shard. ``safe_open``
memory-maps the file, so only the pages of those rows are faulted in; one file is
open at a time so the mapped pages (counted in RSS while mapped) stay bounded by
one file's share.

Checkpoint keys are mapped onto the model's keys with transformers' own renaming
rules (a Qwen2.5-VL checkpoint's ``model.layers.*`` is the model's
``model.language_model.layers.*``). A checkpoint that needs a real tensor
conversion (fused experts, permuted rope, ...) or lacks a key cannot be read
shard by shard; ``plan_sources`` says why and the caller loads through rank 0.
"""

from __future__ import annotations

import json
import logging
import struct
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

INDEX_FILE = "model.safetensors.index.json"


@dataclass(frozen=True)
class Source:
    """Where one model tensor lives in the checkpoint."""

    file: Path
    key: str


class NotShardable(Exception):
    """This checkpoint cannot be read shard by shard (the message says why)."""


@contextmanager
def params_on_meta() -> Iterator[None]:
    """Register every new parameter on the meta device; buffers stay real.

    Parameter storage created by a module's ``__init__`` (``torch.empty``) is
    never touched before it is moved, so it costs no resident memory.
    """
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            kwargs = dict(param.__dict__)  # e.g. flags a subclass keeps on itself
            kwargs["requires_grad"] = param.requires_grad
            module._parameters[name] = type(param)(param.to("meta"), **kwargs)

    nn.Module.register_parameter = register  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.register_parameter = original  # type: ignore[method-assign]


def checkpoint_index(model_dir: str | Path) -> dict[str, Path]:
    """Checkpoint key -> safetensors file, from the index or the files' headers."""
    from safetensors import safe_open

    root = Path(model_dir)
    if not root.is_dir():
        raise NotShardable(f"{model_dir} is not a local directory")
    index = root / INDEX_FILE
    if index.exists():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        return {k: root / f for k, f in weight_map.items()}
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise NotShardable(f"no safetensors files in {model_dir}")
    out: dict[str, Path] = {}
    for f in files:
        with safe_open(f, framework="pt") as sf:  # reads the header only
            out.update(dict.fromkeys(sf.keys(), f))
    return out


def model_key_mapper(model: nn.Module,
                     meta_sd: dict[str, Any]) -> Callable[[str], tuple[str, str | None]]:
    """Checkpoint key -> (the model key transformers would load it into, the conversion
    it applies on the way, or None for a renaming alone)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import (
            WeightConverter,
            WeightRenaming,
            rename_source_key,
        )
    except ImportError:  # an older transformers: names are taken as they are
        return lambda key: (key, None)
    transforms = get_model_conversion_mapping(model)  # type: ignore[arg-type]
    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    prefix = getattr(model, "base_model_prefix", None)
    operations = {str(src): ", ".join(type(op).__name__ for op in c.operations or [])
                  for c in converters for src in c.source_patterns}

    def to_model_key(ckpt_key: str) -> tuple[str, str | None]:
        key, converter = rename_source_key(ckpt_key, renamings, converters, prefix, meta_sd)
        if converter is None:
            return str(key), None
        ops = operations.get(str(converter), "")  # the conversion's source pattern
        return str(key), f"{ops} of {converter}" if ops else str(converter)

    return to_model_key


def _key_mapper(model: nn.Module, meta_sd: dict[str, Any]) -> Callable[[str], str]:
    """Checkpoint key -> the model key transformers would load it into."""
    mapper = model_key_mapper(model, meta_sd)

    def to_model_key(ckpt_key: str) -> str:
        key, converter = mapper(ckpt_key)
        if converter is not None:
            raise NotShardable(f"checkpoint key {ckpt_key} needs a tensor conversion ({converter})")
        return key

    return to_model_key


def plan_sources(model: nn.Module, model_dir: str | Path) -> dict[str, Source]:
    """Model state-dict key -> its checkpoint tensor, for every key the model loads.

    Tied tensors (one Parameter under two names, e.g. ``lm_head.weight`` and the
    input embedding) are planned once, from whichever name the checkpoint has.
    Raises ``NotShardable`` when a key has no source.
    """
    index = checkpoint_index(model_dir)
    meta_sd = model.state_dict(keep_vars=True)
    to_model_key = _key_mapper(model, meta_sd)
    by_model_key: dict[str, Source] = {}
    for ckpt_key, file in index.items():
        mkey = to_model_key(ckpt_key)
        if mkey in meta_sd:
            by_model_key.setdefault(mkey, Source(file, ckpt_key))
    names_of: dict[int, list[str]] = defaultdict(list)
    for name, tensor in meta_sd.items():
        names_of[id(tensor)].append(name)
    plan: dict[str, Source] = {}
    for names in names_of.values():
        found = next((n for n in names if n in by_model_key), None)
        if found is None:
            raise NotShardable(f"the checkpoint has no tensor for {names[0]}")
        plan[found] = by_model_key[found]
    return plan


def local_region(tensor: torch.Tensor) -> tuple[slice, ...]:
    """The slice of the full tensor that this rank holds (the whole tensor if not a DTensor).

    For FSDP2's ``Shard(0)`` this is ``torch.chunk``'s rows for this rank: ceil(n/W)
    rows each, the last chunk shorter or empty.
    """
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if not isinstance(tensor, DTensor):
        return tuple(slice(0, n) for n in tensor.shape)
    shape, offset = compute_local_shape_and_global_offset(
        tensor.shape, tensor.device_mesh, tensor.placements
    )
    return tuple(slice(o, o + n) for o, n in zip(offset, shape, strict=True))


def safetensors_layout(path: Path) -> tuple[int, dict[str, tuple[int, int, list[int]]]]:
    """(start of the data section, key -> (begin, end, shape)) from a file's header.

    The format: 8 bytes little-endian header length, a JSON header whose
    ``data_offsets`` are relative to the end of the header.
    """
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return 8 + n, {k: (*v["data_offsets"], v["shape"]) for k, v in header.items()}


_MADV_POPULATE_WRITE = 23  # Linux >= 5.14


def populate(tensors: list[torch.Tensor]) -> bool:
    """Fault in the pages of fresh CPU tensors in one system call each.

    New fp32 weights are untouched memory; filling them page fault by page fault is
    the largest cost of loading on a VM (docs/benchmarks.md "Model loading").
    ``MADV_POPULATE_WRITE`` maps the same pages without a trap per page. False
    (nothing done) where the kernel lacks it.
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    page = 4096
    for t in tensors:
        if t.device.type != "cpu" or t.numel() == 0:
            continue
        start = t.data_ptr() & ~(page - 1)
        end = (t.data_ptr() + t.numel() * t.element_size() + page - 1) & ~(page - 1)
        if libc.madvise(start, end - start, _MADV_POPULATE_WRITE) != 0:
            return False
    return True


def read_local_shards(model: nn.Module, plan: dict[str, Source]) -> int:
    """Copy this rank's rows of every planned tensor into the model; returns bytes read."""
    from safetensors import safe_open
    from torch.distributed.tensor import DTensor

    state = model.state_dict(keep_vars=True)
    by_file: dict[Path, list[tuple[str, str]]] = defaultdict(list)
    for mkey, src in plan.items():
        by_file[src.file].append((mkey, src.key))
    # In file order, each file's tensors by offset: sequential reads on a cold disk.
    # (Asking the kernel to read this rank's ranges ahead with POSIX_FADV_WILLNEED
    # from a thread was tried: no measurable gain in bench/bench_loading.py.)
    work: list[tuple[Path, list[tuple[str, str, tuple[slice, ...]]]]] = []
    for file in sorted(by_file):
        _, layout = safetensors_layout(file)
        items = sorted(by_file[file], key=lambda item: layout[item[1]][0])
        work.append((file, [(mkey, ckey, local_region(state[mkey])) for mkey, ckey in items]))
    read = 0
    locals_ = [t.to_local() if isinstance(t, DTensor) else t for t in state.values()]
    populate([t for t in locals_ if not t.is_meta])
    with torch.no_grad():
        for file, regions in work:
            # One file mapped at a time: its touched pages leave RSS when it closes.
            with safe_open(file, framework="pt") as f:
                for mkey, ckey, region in regions:
                    target = state[mkey]
                    sl = f.get_slice(ckey)
                    if list(sl.get_shape()) != list(target.shape):
                        raise ValueError(
                            f"{ckey} in {file.name} has shape {sl.get_shape()}, "
                            f"the model's {mkey} is {list(target.shape)}"
                        )
                    local = target.to_local() if isinstance(target, DTensor) else target
                    if local.numel() == 0:  # an empty last chunk
                        continue
                    # A zero-copy view of the mapped rows; copy_ converts the dtype
                    # (bf16 file -> fp32 master weights) on the way.
                    chunk = sl[region] if local.dim() else f.get_tensor(ckey)
                    local.copy_(chunk)
                    read += chunk.numel() * chunk.element_size()
    return read
