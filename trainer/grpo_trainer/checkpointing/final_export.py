"""After the last step: the final model as a Hugging Face directory on the checkpoint volume.

``checkpoint.export`` (the operator sets it) writes ``<dir>/export`` from the final
checkpoint with ``export.export`` (safetensors + config + processor files:
``from_pretrained`` and vLLM load it), so a finished job leaves its model on its claim.
The export holds one copy of the weights in host memory (in the exported dtype, plus
the tensor being read and a 5 GB shard being written): on a GPU job the driver's head
pod is sized for the driver alone, so it runs as a Ray task on rank 0's node once the
ranks are gone (their memory is free; that node's plan holds at least a bf16 copy of
the model at load). It is written to ``export.partial`` and swapped in with its marker, so a
crash leaves the previous export or none, never a half one; a run that finds the
marker of its step (a finished job started again) does not export twice.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .tracker import EXPORT_DIR, EXPORT_MARKER

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinalExport:
    path: Path
    step: int

    def to_message(self) -> dict[str, Any]:
        """The termination message's `export` (the operator puts it in status.export)."""
        return {"path": str(self.path), "step": self.step}


def exported_step(out: Path) -> int | None:
    """The step whose export ``out`` holds complete, or None."""
    try:
        return int(json.loads((out / EXPORT_MARKER).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def export_into(root: str, step: int) -> str:
    """Export checkpoint ``step`` of ``root`` to ``root/export``; returns that path.
    Module level so a Ray task runs it where the memory is."""
    from .export import export

    base = Path(root)
    out, staging, old = (base / EXPORT_DIR, base / f"{EXPORT_DIR}.partial",
                         base / f"{EXPORT_DIR}.old")
    shutil.rmtree(staging, ignore_errors=True)
    done = export(base, staging, step=step)
    (staging / EXPORT_MARKER).write_text(json.dumps({"step": done.step}))
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        out.rename(old)
    staging.rename(out)
    shutil.rmtree(old, ignore_errors=True)
    return str(out)


def export_final(root: Path, step: int, node_id: str | None) -> FinalExport:
    """Export checkpoint ``step`` unless ``root/export`` holds it already: on the Ray node
    ``node_id`` (rank 0's), or here when there is none (Ray not running)."""
    out = root / EXPORT_DIR
    if exported_step(out) == step:
        log.info("final model of step %d already exported to %s", step, out)
        return FinalExport(out, step)
    if node_id is None:
        return FinalExport(Path(export_into(str(root), step)), step)
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # num_cpus 0: it must run on that node whatever its CPUs are reserved for.
    task: Any = ray.remote(num_cpus=0, max_retries=0)(export_into)
    where = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    path = ray.get(task.options(scheduling_strategy=where).remote(str(root), step))
    log.info("exported the final model (step %d) to %s on node %s", step, path, node_id[:8])
    return FinalExport(Path(path), step)
