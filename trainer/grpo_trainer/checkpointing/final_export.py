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

With ``checkpoint.store`` the task first fetches the final checkpoint from the store into
that node's local dir (every file, checked against the manifest), exports there, and
uploads the directory to ``<uri>/export/`` with its marker last, after removing any
earlier export's objects: the marker's absence is the sign of an incomplete one.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_api.trainer_config import ObjectStoreConfig

from .tracker import EXPORT_DIR, EXPORT_MARKER, MANIFEST, Manifest, step_dir_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FinalExport:
    path: str  # a directory, or an s3:// prefix
    step: int

    def to_message(self) -> dict[str, Any]:
        """The termination message's `export` (the operator puts it in status.export)."""
        return {"path": str(self.path), "step": self.step}


def marker_step(marker: bytes | str | None) -> int | None:
    """The step an export's marker (``export.json``) names, or None (none, or unreadable)."""
    try:
        return None if marker is None else int(json.loads(marker)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def exported_step(out: Path) -> int | None:
    """The step whose export ``out`` holds complete, or None."""
    try:
        return marker_step((out / EXPORT_MARKER).read_text())
    except OSError:
        return None


def export_into(root: str, step: int, store: dict[str, Any] | None = None) -> str:
    """Export checkpoint ``step`` of ``root`` to ``root/export``, or with ``store`` (a
    ``checkpoint.store``) to the store's ``export/``; returns where. Module level so a Ray
    task runs it where the memory is."""
    from .export import export

    if store is not None:
        return _export_to_store(Path(root), step, ObjectStoreConfig(**store))
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


def _export_to_store(base: Path, step: int, cfg: ObjectStoreConfig) -> str:
    from ..object_store import ObjectStore
    from .rank_store import fetch

    store = ObjectStore(cfg)
    step_dir = base / step_dir_name(step)
    raw = store.get_bytes(f"{step_dir.name}/{MANIFEST}")
    if raw is None:
        raise RuntimeError(f"checkpoint {step_dir.name} is not complete in {cfg.uri}")
    manifest = Manifest.model_validate_json(raw)
    step_dir.mkdir(parents=True, exist_ok=True)
    (step_dir / MANIFEST).write_bytes(raw)
    problems = fetch(store, step_dir, manifest.files,
                     {k: v.size for k, v in manifest.files.items()})
    if problems:
        raise RuntimeError(f"cannot export {step_dir.name} from {cfg.uri}: {problems}")
    local = Path(export_into(str(base), step))
    store.delete(list(store.sizes(f"{EXPORT_DIR}/")))
    files = sorted(f for f in local.rglob("*") if f.is_file() and f.name != EXPORT_MARKER)
    for f in [*files, local / EXPORT_MARKER]:  # the marker last
        store.put_file(f"{EXPORT_DIR}/{f.relative_to(local)}", f)
    shutil.rmtree(local)
    shutil.rmtree(step_dir)
    return f"{store.location}/{EXPORT_DIR}"


def stored_export_step(cfg: ObjectStoreConfig) -> int | None:
    from ..object_store import ObjectStore

    return marker_step(ObjectStore(cfg).get_bytes(f"{EXPORT_DIR}/{EXPORT_MARKER}"))


def export_final(root: Path, step: int, node_id: str | None,
                 store: ObjectStoreConfig | None = None) -> FinalExport:
    """Export checkpoint ``step`` unless ``root/export`` (or the store's ``export/``)
    holds it already: on the Ray node ``node_id`` (rank 0's), or here when there is none
    (Ray not running)."""
    out = str(root / EXPORT_DIR) if store is None else f"{store.uri.rstrip('/')}/{EXPORT_DIR}"
    done = exported_step(Path(out)) if store is None else stored_export_step(store)
    if done == step:
        log.info("final model of step %d already exported to %s", step, out)
        return FinalExport(out, step)
    wire = store.model_dump() if store is not None else None
    if node_id is None:
        return FinalExport(export_into(str(root), step, wire), step)
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # num_cpus 0: it must run on that node whatever its CPUs are reserved for.
    task: Any = ray.remote(num_cpus=0, max_retries=0)(export_into)
    where = NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
    path = ray.get(task.options(scheduling_strategy=where).remote(str(root), step, wire))
    log.info("exported the final model (step %d) to %s on node %s", step, path, node_id[:8])
    return FinalExport(path, step)
