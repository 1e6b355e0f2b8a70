"""``checkpoint.store.keep_attempts``: what an attempt leaves, kept in the store.

A job with ``checkpoint.store`` and no claim stages on each pod's own disk, which goes with
the pod. What ``attempts/<n>/`` holds there on the head (the head's output, which holds
the ranks' lines too, as Ray sends them to the driver; the attempts' Kubernetes events;
the stall stacks) is copied to the store's ``attempts/<n>/`` every ``INTERVAL_S`` while
the driver runs and once more at its very end, so a user debugging attempt 2 of 5 reads
it there (status.attempts[n].logs says where). A head killed outright (SIGKILL, its node
lost) keeps what the last copy had. The store down costs the copy, never the run.
"""

from __future__ import annotations

import logging
import stat
import threading
from pathlib import Path

from grpo_api.contract import ATTEMPT_LOGS
from grpo_api.trainer_config import Config

from ..object_store import ObjectStore, StoreRefused, StoreUnavailable

log = logging.getLogger(__name__)

INTERVAL_S = 30.0


class AttemptKeeper:
    """Copies the files under ``<root>/attempts/`` that changed since the last copy."""

    def __init__(self, root: Path, store: ObjectStore, interval_s: float = INTERVAL_S) -> None:
        self.root = root
        self.store = store
        self.interval_s = interval_s
        self._sent: dict[str, tuple[int, int]] = {}  # name -> (size, mtime_ns) copied
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def sync(self) -> int:
        """Copy what changed; how many files. Errors are logged, never raised."""
        with self._lock:
            copied = 0
            for path in sorted((self.root / ATTEMPT_LOGS).rglob("*")):
                try:
                    st = path.stat()
                    if not stat.S_ISREG(st.st_mode):
                        continue
                    name = str(path.relative_to(self.root))
                    seen = (st.st_size, st.st_mtime_ns)
                    if self._sent.get(name) == seen:
                        continue
                    # A snapshot: a log grows while it is read.
                    self.store.put_bytes(name, path.read_bytes())
                except FileNotFoundError:
                    continue
                except (OSError, StoreUnavailable, StoreRefused) as err:
                    log.warning("could not keep %s in the store: %s", path, err)
                    return copied
                self._sent[name] = seen
                copied += 1
            return copied

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.wait(self.interval_s):
                self.sync()

        self._thread = threading.Thread(target=loop, name="attempt-keeper", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """The last copy, at the driver's end: after its last line and events."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s)
        n = self.sync()
        log.info("kept %d file(s) of attempts/ in the store %s", n, self.store.location)


def keeper_for(cfg: Config) -> AttemptKeeper | None:
    store = cfg.checkpoint.store
    if store is None or not store.keep_attempts or cfg.checkpoint.dir is None:
        return None
    return AttemptKeeper(Path(cfg.checkpoint.dir), ObjectStore(store))
