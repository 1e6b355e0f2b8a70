"""Thin HTTP edge: a hub repo's config.json, for admission, reconcile and `grpo plan`.

One GET (grpo_api.model_config.read_url, short timeout), answers cached by URL (the
endpoint, repo and revision make it): a job is checked at apply and planned right after,
and many jobs of one model read it once. A failed read is kept only briefly, so a retry
after RETRY_SECONDS asks the hub again. The admission webhooks are served by a process of
their own (admission_process.py): a public repo's answer is also written to a directory
both processes share (share_between_processes), so the plan right after the apply reads
the admission's answer instead of asking the hub again. The operator reads public repos
only (a private one is read by a pod with the job's Secret); `grpo plan` passes the
user's token for a job that names one, sent as the reader pod sends it (read_url's
Authorization header).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from grpo_api.model_config import ConfigUnavailable, read_url, shape_fields

from .reconcile import HubAnswer

OK_TTL_S = 600.0
FAILED_TTL_S = 10.0
MAX_ENTRIES = 256

_lock = threading.Lock()
_cache: dict[str, tuple[float, HubAnswer]] = {}
_shared: Path | None = None  # set in the operator's process before the admission one forks


SHARED_PREFIX = "grpo-operator-hub-"


def shared_directory(parent: Path) -> Path:
    """A new directory for share_between_processes, named after this process; those of
    processes that are gone are removed first (an operator SIGKILLed, or a container
    restarted with the same PID in an emptyDir that outlived the one before)."""
    for stale in parent.glob(f"{SHARED_PREFIX}*-*"):
        pid = stale.name[len(SHARED_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and (int(pid) == os.getpid() or not _alive(int(pid))):
            shutil.rmtree(stale, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{SHARED_PREFIX}{os.getpid()}-", dir=parent))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's
    return True


def share_between_processes(directory: Path) -> None:
    """Keep public repos' answers in ``directory`` too, for the operator's other process
    (time.monotonic is one clock for every process of a Linux host)."""
    global _shared
    _shared = directory


def read(url: str, clock: Callable[[], float] = time.monotonic, *,
         token: str | None = None) -> HubAnswer:
    """The hub's answer for `url` (with `token`, a private repo's), from the cache while
    it is fresh. A token's answer is kept apart from the public one, under a digest of
    the token: the cache never holds the token itself."""
    key = f"{url} {hashlib.sha256(token.encode()).hexdigest()}" if token else url
    now = clock()
    with _lock:
        hit = _cache.get(key)
    if hit is not None and hit[0] > now:
        return hit[1]
    shared = _read_shared(key, now) if token is None else None
    if shared is not None:
        with _lock:
            _cache[key] = shared
        return shared[1]
    try:
        answer = HubAnswer(url, config=shape_fields(read_url(url, token)))
    except ConfigUnavailable as exc:
        answer = HubAnswer(url, error=str(exc), retry=exc.retry)
    ttl = OK_TTL_S if answer.config is not None else FAILED_TTL_S
    with _lock:
        if len(_cache) >= MAX_ENTRIES:
            _cache.pop(next(iter(_cache)))  # the oldest entry
        _cache[key] = (clock() + ttl, answer)
    if token is None and answer.config is not None:
        _write_shared(key, _cache[key])
    return answer


def _shared_file(key: str) -> Path | None:
    return _shared / f"{hashlib.sha256(key.encode()).hexdigest()}.json" if _shared else None


def _read_shared(key: str, now: float) -> tuple[float, HubAnswer] | None:
    path = _shared_file(key)
    try:
        stored = json.loads(path.read_text()) if path else None
    except (OSError, ValueError):
        return None
    if not stored or stored["expires"] <= now:
        return None
    return stored["expires"], HubAnswer(**stored["answer"])


def _write_shared(key: str, entry: tuple[float, HubAnswer]) -> None:
    """Written whole, then renamed: the other process never reads half a file."""
    path = _shared_file(key)
    if path is None:
        return
    try:
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as out:
            json.dump({"expires": entry[0], "answer": asdict(entry[1])}, out)
        os.replace(out.name, path)
    except OSError:
        pass  # a full or read-only disk: the other process asks the hub itself


def forget() -> None:
    """Empty the cache (tests)."""
    with _lock:
        _cache.clear()
    if _shared is not None:
        for stale in _shared.glob("*.json"):
            stale.unlink(missing_ok=True)
