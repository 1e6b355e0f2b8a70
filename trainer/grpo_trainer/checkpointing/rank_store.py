"""One rank's side of ``checkpoint.store``: its files up after a save, the files its load
reads down before it.

A rank saves into its pod's local ``checkpoint.dir`` as without a store; once its files
are durable there, ``RankUpload`` sends them to ``<uri>/step-<N>/`` in a background thread,
retrying with backoff while the store is down, and removes the local copies once they
are up (the pod's disk holds one save at a time). The rank's save counts as finished only
then, so the driver writes the manifest, the checkpoint's complete marker, after every
file it names is in the store.

On load a rank fetches only what it reads: the DCP metadata and the RNG files first, then
the shard files its load plan names (``plan_files``), each into the same local path. Every
rank's fetch problems go through one collective (``agree``), so all ranks decide alike
whatever the store did to each.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch.distributed as dist

from ..object_store import ObjectStore, StoreRefused, StoreUnavailable, retrying

log = logging.getLogger(__name__)


class RankUpload:
    """This rank's files of one save, sent to the store in a background thread; the
    deadline (``upload_deadline_s``) runs from the save's start, across its files."""

    def __init__(self, store: ObjectStore, step_dir: Path, names: Iterable[str],
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.store, self.step_dir = store, step_dir
        self.names = sorted(names)
        self._sleep = sleep
        self.started = time.monotonic()
        self.tries = 0
        self.last_error = ""
        self.bytes = 0
        self.seconds = 0.0
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="checkpoint-upload",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for name in self.names:
                self._put(name)
            self.seconds = time.monotonic() - self.started
            for name in self.names:  # the pod's disk holds one save at a time
                (self.step_dir / name).unlink(missing_ok=True)
        except BaseException as exc:  # handed to poll(), which re-raises on the caller
            self._error = exc
        finally:
            self._done.set()

    def _put(self, name: str) -> None:
        path = self.step_dir / name
        key = f"{self.step_dir.name}/{name}"

        def attempt() -> None:
            self.tries += 1
            self.store.put_file(key, path)

        def note(exc: StoreUnavailable) -> None:
            self.last_error = str(exc)

        retrying(f"checkpoint upload of {key} to {self.store.location}", attempt,
                 self.store.cfg.upload_deadline_s, since=self.started, sleep=self._sleep,
                 on_error=note)
        self.bytes += path.stat().st_size

    def status(self) -> dict[str, Any]:
        """What the driver reports while it waits (the CheckpointUpload condition)."""
        return {"uploading": self.step_dir.name, "tries": self.tries,
                "waited_s": round(time.monotonic() - self.started, 1),
                "error": self.last_error}

    def poll(self, wait: bool) -> bool:
        """Whether every file is up; re-raises the thread's failure."""
        if wait:
            self._done.wait()
        if not self._done.is_set():
            return False
        if self._error is not None:
            raise self._error
        return True


def fetch(store: ObjectStore, step_dir: Path, names: Iterable[str],
          sizes: dict[str, int] | None = None) -> list[str]:
    """Download each named file of the step into ``step_dir`` unless it is there whole
    (a rank on the same pod fetched it, or it was never removed); the problems, one line
    per file that could not be fetched (the digests are checked after, by the caller)."""
    problems: list[str] = []
    for name in sorted(set(names)):
        local = step_dir / name
        want = None if sizes is None else sizes.get(name)
        if local.is_file() and (want is None or local.stat().st_size == want):
            continue
        try:
            store.download(f"{step_dir.name}/{name}", local)
        except FileNotFoundError:
            problems.append(f"{name}: not in {store.location}/{step_dir.name}")
        except (StoreUnavailable, StoreRefused) as exc:
            problems.append(f"{name}: {exc}")
    return problems


def agree(problems: list[str], pg: Any) -> list[str]:
    """Every rank's problems, on every rank (collective over ``pg``)."""
    everyone: list[Any] = [None] * dist.get_world_size(pg)
    dist.all_gather_object(everyone, problems, group=pg)
    return sorted({p for probs in everyone for p in probs})


def plan_files(targets: dict[str, Any], metadata: Any) -> set[str]:
    """The shard files DCP's default load planner will read for ``targets`` on this rank
    (``dcp.load`` without a planner argument plans the same way)."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    planner = DefaultLoadPlanner()
    planner.set_up_planner(targets, metadata, is_coordinator=False)
    plan = planner.create_local_plan()
    storage = metadata.storage_data
    return {storage[item.storage_index].relative_path for item in plan.items}
