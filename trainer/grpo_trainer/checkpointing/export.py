"""``grpo-train export``: any checkpoint -> a Hugging Face directory, offline, on CPU.

Reads only the model's tensors from the DCP files (never the optimizer state),
whatever number of ranks saved them, puts them into the model class built from
the original ``config.json`` on the meta device (no random init, one copy of the
weights in memory), writes safetensors with ``save_pretrained`` and copies the
tokenizer/processor files from the model path, so ``from_pretrained`` (and vLLM)
load the result.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import yaml

from grpo_api.trainer_config import Config, ModelConfig

from .dcp import check_sizes, committed_step
from .files import digest_file
from .tracker import CONFIG, digest_problems, step_dir_name

log = logging.getLogger(__name__)

MODEL_PREFIX = "model."
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


class ExportError(RuntimeError):
    pass


@dataclass(frozen=True)
class Exported:
    step: int
    out: Path
    tensors: int
    bytes: int


def pick_step(root: Path, step: int | None) -> int:
    """``step`` if given, else the tracker's, else the newest complete directory."""
    chosen = step if step is not None else committed_step(root)
    if chosen is None:
        raise ExportError(f"no complete checkpoint in {root}")
    return chosen


def verify(step_dir: Path) -> None:
    """Every file present, at its size and digest; raises naming what is wrong."""
    manifest, problems = check_sizes(step_dir)
    if manifest is not None and not problems:
        entries = manifest.entries()
        actual = {k: digest_file(step_dir / k, manifest.algorithm) for k in entries}
        problems = digest_problems(entries, actual)
    if problems or manifest is None:
        raise ExportError(f"checkpoint {step_dir} is corrupt or incomplete: {'; '.join(problems)}")


def load_model_tensors(step_dir: Path, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The full (unsharded) model tensors, named as the HF module names them; in
    ``dtype`` if given (DCP converts each item as it reads it, so a float32 checkpoint
    never sits in memory whole next to its bfloat16 copy)."""
    return load_tensors(step_dir, MODEL_PREFIX, dtype)


def load_tensors(
    step_dir: Path, prefix: str, dtype: torch.dtype | None = None
) -> dict[str, torch.Tensor]:
    """Every full tensor whose DCP key starts with ``prefix`` (``model.``, or
    ``optim.state.`` for the optimizer's), keyed without it; one process, no ranks."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    reader = FileSystemReader(str(step_dir))
    metadata = reader.read_metadata()
    state: dict[str, torch.Tensor] = {}
    for key, md in metadata.state_dict_metadata.items():
        if key.startswith(prefix) and isinstance(md, TensorStorageMetadata):
            state[key] = torch.empty(md.size, dtype=dtype or md.properties.dtype)
    if not state:
        raise ExportError(f"{step_dir} holds no tensors under {prefix}")
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, storage_reader=reader, no_dist=True)
    return {k.removeprefix(prefix): v for k, v in state.items()}


def saved_config(step_dir: Path) -> Config:
    return Config.model_validate(yaml.safe_load((step_dir / CONFIG).read_text()))


def _copy_side_files(src: Path, out: Path) -> list[str]:
    """Tokenizer, processor, chat template, generation config: everything but weights."""
    copied = []
    for p in sorted(src.iterdir()):
        if not p.is_file() or p.name == "config.json":
            continue
        if p.name.endswith(WEIGHT_SUFFIXES) or p.name in WEIGHT_INDEXES:
            continue
        shutil.copy2(p, out / p.name)
        copied.append(p.name)
    return copied


def _save_side_files_from_hub(mcfg: ModelConfig, out: Path) -> None:
    from transformers import AutoProcessor, AutoTokenizer

    path = mcfg.tokenizer_path or mcfg.path
    AutoTokenizer.from_pretrained(path, trust_remote_code=mcfg.trust_remote_code).save_pretrained(
        out
    )
    with contextlib.suppress(OSError, ValueError, TypeError):  # text-only: no processor
        AutoProcessor.from_pretrained(
            path, trust_remote_code=mcfg.trust_remote_code
        ).save_pretrained(out)


def export(
    checkpoint_dir: str | Path,
    out: str | Path,
    *,
    step: int | None = None,
    model_path: str | None = None,
    dtype: str | None = None,
    check: bool = True,
    adapter_out: str | Path | None = None,
) -> Exported:
    from ..model.modeling import _auto_class, load_hf_config

    t0 = time.perf_counter()
    root = Path(checkpoint_dir)
    chosen = pick_step(root, step)
    step_dir = root / step_dir_name(chosen)
    if not step_dir.is_dir():
        raise ExportError(f"no checkpoint directory {step_dir}")
    if check:
        verify(step_dir)
    cfg = saved_config(step_dir)
    mcfg = cfg.model
    if model_path is not None:
        mcfg = mcfg.model_copy(update={"path": model_path, "tokenizer_path": None})
    hf_config = load_hf_config(mcfg)
    target = _dtype(dtype, hf_config)
    lora = cfg.actor.lora is not None or adapter_out is not None
    # LoRA merges its fp32 adapters into the base at the precision they were saved in.
    tensors = load_model_tensors(step_dir, None if lora else target)
    if lora:
        tensors = _lora_to_full(mcfg, cfg, tensors, adapter_out, target)
    with torch.device("meta"):
        model: Any = _auto_class(hf_config).from_config(
            hf_config, dtype=target, trust_remote_code=mcfg.trust_remote_code
        )
    for k in list(tensors):  # one tensor at a time (LoRA's merge): never two copies
        tensors[k] = tensors[k].to(target)
    missing, unexpected = model.load_state_dict(tensors, strict=False, assign=True)
    if missing or unexpected:
        raise ExportError(
            f"checkpoint does not match {type(model).__name__}: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}"
        )
    model.tie_weights()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    # safetensors serialises a whole shard in memory: 5 GB shards (the hub's usual) keep
    # that copy small next to the weights.
    model.save_pretrained(out, safe_serialization=True, max_shard_size="5GB")
    src = Path(mcfg.tokenizer_path or mcfg.path)
    if src.is_dir():
        _copy_side_files(src, out)
        if mcfg.tokenizer_path and Path(mcfg.path).is_dir():
            gen = Path(mcfg.path) / "generation_config.json"
            if gen.is_file():
                shutil.copy2(gen, out / gen.name)
    else:
        _save_side_files_from_hub(mcfg, out)
    n_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    log.info(
        "exported step %d from %s to %s: %d tensors, %.1f MB (%s) in %.1f s",
        chosen,
        step_dir,
        out,
        len(tensors),
        n_bytes / 1e6,
        target,
        time.perf_counter() - t0,
    )
    return Exported(chosen, out, len(tensors), n_bytes)


def _lora_to_full(
    mcfg: ModelConfig,
    cfg: Config,
    tensors: dict[str, torch.Tensor],
    adapter_out: str | Path | None,
    dtype: torch.dtype,
) -> dict[str, torch.Tensor]:
    """A LoRA checkpoint's adapters merged into the base (and written as a PEFT
    directory to ``adapter_out`` if given)."""
    from ..lora.peft_format import write_adapter_dir
    from .adapter_merge import NotAnAdapterCheckpoint, merged_model_tensors

    lora = cfg.actor.lora
    if lora is None:
        raise ExportError("--adapter-out needs a LoRA checkpoint (actor.lora set in its config)")
    if adapter_out is not None:
        write_adapter_dir(Path(adapter_out), lora, tensors, mcfg.path, dtype)
    try:
        return merged_model_tensors(mcfg, lora, tensors)
    except NotAnAdapterCheckpoint as err:
        raise ExportError(str(err)) from err


def _dtype(name: str | None, hf_config: Any) -> torch.dtype:
    """The requested dtype, else the one the original config declares, else float32."""
    if name is not None:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[
            name
        ]
    declared = getattr(hf_config, "dtype", None) or getattr(hf_config, "torch_dtype", None)
    if isinstance(declared, torch.dtype):
        return declared
    if isinstance(declared, str) and hasattr(torch, declared):
        return getattr(torch, declared)
    return torch.float32
