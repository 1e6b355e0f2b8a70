"""The driver's side of ``checkpoint.store``: its local ``checkpoint.dir`` mirrors the
store's small files, so the checkpointer's logic (fence, tracker, manifests, retention)
runs unchanged on local files, and the store stays the truth.

- ``pull`` (at start): the fence, the tracker, and each step's manifest and driver files
  come down; a step directory that is in the store without its manifest (a save cut off
  mid-upload) is mirrored as an empty directory, so start-up sees it incomplete and
  removes it, here and in the store. Local step directories the store lacks go.
- ``push`` (at commit): local files go up in the order given: the driver's files, then the
  manifest (the complete marker, after every file it names), then the tracker.
- ``remove_step``: retention and start-up's clean-up, in both places.
- ``sizes``: what the store holds of a step, for the size check before a load.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from ..config_error import ConfigError
from ..object_store import ObjectStore, StoreUnavailable, retrying
from .files import atomic_write
from .tracker import (
    CONFIG,
    FENCE,
    MANIFEST,
    TRACKER,
    TRAINER_STATE,
    parse_step_dir,
    parse_tracker,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
# A step's files the driver reads before any rank loads (its own, and the manifest).
DRIVER_FILES = (MANIFEST, TRAINER_STATE, CONFIG)


class StoreMirror:
    def __init__(self, store: ObjectStore, root: Path,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.root = root
        self._listing: dict[str, int] = {}
        self._sleep = sleep

    def _retrying(self, what: str, fn: Callable[[], T]) -> T:
        return retrying(what, fn, self.store.cfg.upload_deadline_s, sleep=self._sleep)

    def _get(self, name: str) -> bool:
        data = self.store.get_bytes(name)
        if data is None:
            (self.root / name).unlink(missing_ok=True)
            return False
        (self.root / name).parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.root / name, data)
        return True

    def pull(self) -> None:
        self._retrying("reading the checkpoint store", self._pull)

    def _pull(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._listing = self.store.sizes()
        steps: dict[str, bool] = {}
        for name in self._listing:
            top, _, rest = name.partition("/")
            if parse_step_dir(top) is not None and rest:
                steps[top] = steps.get(top, False) or rest == MANIFEST
        for p in self.root.iterdir():
            if parse_step_dir(p.name) is not None and p.name not in steps:
                shutil.rmtree(p, ignore_errors=True)
        for step_dir, complete in steps.items():
            local = self.root / step_dir
            if not complete:
                local.mkdir(exist_ok=True)
                (local / MANIFEST).unlink(missing_ok=True)
                continue
            for name in DRIVER_FILES:
                if f"{step_dir}/{name}" in self._listing:
                    self._get(f"{step_dir}/{name}")
        for name in (FENCE, TRACKER):
            self._get(name)
        log.info("checkpoint store %s: %d complete and %d incomplete step(s), %.1f MB",
                 self.store.location, sum(steps.values()),
                 sum(not c for c in steps.values()), sum(self._listing.values()) / 1e6)

    def committed_step(self) -> int | None:
        """The store's ``latest``, when it answers (for messages before the pull)."""
        try:
            data = self.store.get_bytes(TRACKER)
        except (StoreUnavailable, ConfigError) as exc:
            log.warning("the checkpoint store's latest step is unknown: %s", exc)
            return None
        tracker = parse_tracker(data.decode()) if data is not None else None
        return tracker.step if tracker else None

    def pull_fence(self) -> None:
        """The store's fence, when the store answers; else the local copy stands (a
        commit cannot happen before the store is back: its push waits for it)."""
        try:
            self._get(FENCE)
        except StoreUnavailable as exc:
            log.warning("attempt fence not read from the store (the local copy is used): %s",
                        exc)

    def push(self, names: list[str]) -> None:
        for name in names:
            self._retrying(f"uploading {name}",
                           lambda n=name: self.store.put_file(n, self.root / n))  # type: ignore[misc]

    def remove_step(self, step_dir: str) -> None:
        def remove() -> list[str]:
            names = list(self.store.sizes(f"{step_dir}/"))
            self.store.delete(names)
            return names

        for n in self._retrying(f"removing {step_dir} from the store", remove):
            self._listing.pop(n, None)

    def sizes(self, step_dir: str) -> dict[str, int]:
        """The step's objects (names relative to the step) -> sizes, as listed at pull."""
        head = f"{step_dir}/"
        return {n[len(head):]: s for n, s in self._listing.items() if n.startswith(head)}
