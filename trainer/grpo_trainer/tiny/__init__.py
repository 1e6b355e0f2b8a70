"""Tiny but real models and datasets, built offline: for tests, demos and benchmarks,
and for `grpo-train make-tiny`, which builds a first job's model and data in its init
container (examples/grpojob-first.yaml), so that job needs no hub and no prepared claim."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

# The tiny Qwen2.5-VL's hidden size: 4 heads of 32, the least vLLM's CPU attention takes,
# so the job also runs with `rollout: {engine: vllm}`.
TINY_VL_HIDDEN = 128
DONE = "tiny.json"  # written last: its presence means the build is complete


@dataclass(frozen=True)
class Tiny:
    """Where a tiny build put its model and its train split."""

    model: Path
    train: Path
    built: bool  # False: an earlier complete build was found and kept


def make_tiny(out: str | Path, rows: int = 32) -> Tiny:
    """A random-weight tiny Qwen2.5-VL (tokenizer and processor included) at
    ``<out>/model`` and an EasyR1-layout parquet split of ``rows`` image prompts at
    ``<out>/train.parquet``.

    An init container runs once per attempt, so a complete earlier build is kept: a
    restarted job resumes from checkpoints of this very model. The build happens in a
    sibling directory renamed into place at the end, so one killed half-way leaves
    nothing that passes for complete."""
    from .data import write_vision_task
    from .models import build_tiny_qwen2_5_vl

    out = Path(out)
    done = Tiny(out / "model", out / "train.parquet", built=True)
    if (out / DONE).exists():
        return Tiny(done.model, done.train, built=False)
    partial = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    build_tiny_qwen2_5_vl(partial / "model", hidden=TINY_VL_HIDDEN)
    write_vision_task(partial / "train.parquet", rows=rows)
    (partial / DONE).write_text(json.dumps({"hidden": TINY_VL_HIDDEN, "rows": rows}) + "\n")
    shutil.rmtree(out, ignore_errors=True)  # an incomplete build of something else
    partial.rename(out)
    return done
