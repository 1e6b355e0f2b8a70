"""SIGTERM: the driver saves its last finished step, the ranks stay until it has.

A preemption, a drain or a suspend deletes the pods, and every process gets SIGTERM at
once. The driver's handler only notes it: the training loop lets the rank call in flight
return (a rank runs one method at a time, so nothing can start before it), keeps the step
if its update has finished and drops it otherwise (the loader is rewound), commits a
checkpoint of that step unless one exists, and ends with exit 143 (``Terminated``). The
ranks' handler defers their exit meanwhile: the driver ending (or killing them) ends them,
and ``RANK_DEFER_LIMIT_S`` bounds the wait should it never come.

A drain deletes one pod. A worker pod's SIGTERM goes to its own `ray start` only, after
its preStop hook (prestop.py), which writes the attempt's stop request on the checkpoint
claim; the driver polls for that file and stops exactly as on its own SIGTERM. A job with
``checkpoint.store`` and no claim shares no directory between its pods: both files are
then also objects in the store, under the same names (``keep_attempts``).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from grpo_api.contract import driver_done_marker, driver_stop_request
from grpo_api.trainer_config import Config, ObjectStoreConfig

if TYPE_CHECKING:
    from ..object_store import ObjectStore

log = logging.getLogger(__name__)

# A rank that got SIGTERM exits at the latest this long after it, whatever the driver
# does: the kubelet's SIGKILL at the end of the grace period comes first on a cluster
# (a save of the largest planned checkpoint takes minutes, never ten).
RANK_DEFER_LIMIT_S = 600.0
STOP_REQUEST_POLL_S = 1.0


@dataclass(frozen=True)
class AttemptFiles:
    """The driver's two files on the checkpoint claim, shared with the preStop hooks; with
    ``store`` (no claim) also objects there, named as the files are below ``root``."""

    done: Path  # written by the driver at its end: the hooks let Ray stop
    stop: Path  # written by a hook whose pod alone is deleted: the driver stops
    root: Path | None = None
    store: ObjectStore | None = None

    @classmethod
    def at(cls, checkpoint_dir: str, job_uid: str, attempt: int,
           store: ObjectStoreConfig | None = None) -> AttemptFiles:
        shared = None
        if store is not None and store.keep_attempts:
            from ..object_store import ObjectStore

            shared = ObjectStore(store)
        return cls(Path(driver_done_marker(checkpoint_dir, job_uid, attempt)),
                   Path(driver_stop_request(checkpoint_dir, job_uid, attempt)),
                   Path(checkpoint_dir), shared)

    @classmethod
    def of(cls, cfg: Config) -> AttemptFiles | None:
        if cfg.checkpoint.dir is None:
            return None
        return cls.at(str(cfg.checkpoint.dir), cfg.trainer.job_uid or "", cfg.trainer.attempt,
                      cfg.checkpoint.store)

    def clear(self) -> None:
        """At the driver's start: an earlier local run's (same uid and attempt) are stale."""
        self.done.unlink(missing_ok=True)
        self.stop.unlink(missing_ok=True)
        self._in_store(lambda store: store.delete([self._name(self.done),
                                                   self._name(self.stop)]))

    def write_done(self) -> None:
        self._write(self.done, "")  # should it fail, the hooks wait out their timeout

    def request_stop(self, pod: str) -> None:
        self._write(self.stop, pod)  # should it fail, only the save is lost

    def is_done(self) -> bool:
        return self.done.exists() or self._read(self.done) is not None

    def stop_requested(self) -> str | None:
        """Who asked the driver to stop (a pod's name), "" if unsaid; None if none did."""
        if self.stop.exists():
            try:
                return self.stop.read_text().strip()
            except OSError:
                return ""
        return self._read(self.stop)

    def _name(self, path: Path) -> str:
        assert self.root is not None
        return str(path.relative_to(self.root))

    def _read(self, path: Path) -> str | None:
        data = self._in_store(lambda store: store.get_bytes(self._name(path)))
        return data.decode(errors="replace").strip() if isinstance(data, bytes) else None

    def _in_store(self, fn: Any) -> Any:
        """``fn(store)``, or None without a store or when the store fails (a marker that
        cannot be read or written costs the wait it would have cut short, never the run)."""
        if self.store is None:
            return None
        from ..object_store import StoreRefused, StoreUnavailable

        try:
            return fn(self.store)
        except (StoreUnavailable, StoreRefused, OSError) as err:
            log.warning("the store could not serve the attempt's marker: %s", err)
            return None

    def _write(self, path: Path, text: str) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        except OSError as err:
            log.warning("could not write %s: %s", path, err)
        self._in_store(lambda store: store.put_bytes(self._name(path), text.encode()))


class Terminated(Exception):
    """The driver stopped on SIGTERM after committing its last finished step."""

    def __init__(self, step: int, saved: bool, save_s: float | None) -> None:
        what = (f"committed a checkpoint of step {step} in {save_s:.2f} s" if saved
                else f"step {step} was already checkpointed" if step else "no step finished")
        super().__init__(f"stopped on SIGTERM: {what}")
        self.step = step


class StepAbandoned(Exception):
    """SIGTERM came before this step's update: the step is dropped, not finished."""


class TermSignal:
    """The driver's SIGTERM flag: set by the handler, read by the training loop."""

    def __init__(self) -> None:
        self.at: float | None = None
        self._previous: Any = None
        self._watching = threading.Event()

    @property
    def requested(self) -> bool:
        return self.at is not None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning("not saving on SIGTERM: the trainer does not run in the main thread")
            return
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def watch(self, stop_request: Path | AttemptFiles) -> None:
        """Also stop when ``stop_request`` appears (a worker pod's preStop hook)."""
        self._watching.set()
        files = stop_request if isinstance(stop_request, AttemptFiles) else \
            AttemptFiles(stop_request, stop_request)

        def poll() -> None:
            while self._watching.is_set() and self.at is None:
                who = files.stop_requested()
                if who is not None:
                    self._request(f"{who or 'a worker pod'} is being deleted (its preStop "
                                  "hook asked)")
                    return
                time.sleep(STOP_REQUEST_POLL_S)

        threading.Thread(target=poll, name="stop-request", daemon=True).start()

    def restore(self) -> None:
        self._watching.clear()
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def _request(self, why: str) -> None:
        if self.at is None:
            self.at = time.monotonic()
            log.warning("%s: saving the last finished step, then stopping", why)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._request("SIGTERM")


def defer_in_rank(rank: int, limit_s: float = RANK_DEFER_LIMIT_S) -> bool:
    """In a rank's process (Ray actor, main thread): SIGTERM no longer ends it at once;
    it ends when the driver ends or kills it, or ``limit_s`` after the signal."""
    if threading.current_thread() is not threading.main_thread():
        log.warning("rank %d: SIGTERM not deferred (not on the main thread)", rank)
        return False

    def handle(signum: int, frame: FrameType | None) -> None:
        log.warning("rank %d: SIGTERM; staying up until the driver's save is committed "
                    "(at most %.0f s)", rank, limit_s)
        timer = threading.Timer(limit_s, os._exit, args=(143,))
        timer.daemon = True
        timer.start()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one timer is enough

    signal.signal(signal.SIGTERM, handle)
    return True
