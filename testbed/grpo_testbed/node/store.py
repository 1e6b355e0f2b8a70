"""Where the node's containerd keeps images: one store under the testbed cache, reused
by the next run, so the 7 GB trainer image is imported once per build, not per testbed.

containerd locks its store, so only one running node can use it: the first takes an
exclusive lock; a second node on the same machine (two test runs at once) gets a store of
its own in its work directory and imports into it. The images in the store are checked
against podman's by image ID before use (images.py), so a stale store is never trusted.
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from ..versions import CONTAINERD_VERSION, cache_root

log = logging.getLogger("grpo_testbed.node")


@dataclass
class ImageStore:
    path: Path
    _lock: IO[bytes] | None = None

    @property
    def shared(self) -> bool:
        return self._lock is not None

    def release(self) -> None:
        if self._lock is not None:
            self._lock.close()  # closing the descriptor drops the flock
            self._lock = None


def shared_store_path() -> Path:
    return cache_root() / "node" / f"containerd-{CONTAINERD_VERSION}"


def acquire_store(workdir: Path, shared: Path | None = None) -> ImageStore:
    """The shared store (``shared``, by default the testbed cache's), locked; or, while
    another node holds it, a store of this node's own under ``workdir``."""
    shared = shared or shared_store_path()
    shared.mkdir(parents=True, exist_ok=True)
    lock_path = shared.parent / f"{shared.name}.lock"
    lock = open(lock_path, "wb")  # noqa: SIM115 - held until release()
    try:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        own = workdir / "containerd" / "root"
        log.info("the shared image store is in use (another testbed, pid in %s); "
                 "this node imports into its own store %s", lock_path, own)
        return ImageStore(own)
    lock.write(str(os.getpid()).encode())
    lock.flush()
    return ImageStore(shared, lock)
