"""A small thread-safe cache of reads from the API server, each kept for a fixed time.

Admission and reconcile ask for the same few facts (the GPU Nodes, a namespace's labels
and quotas) on every decision; in a burst of creates one read serves them all. A key's
first reader loads it while the others asking for that key wait for its answer, so a
burst of N admissions makes one read, not N.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class TtlCache(Generic[K, V]):
    """``get(key, load)``: the value ``load()`` gave for ``key`` less than ``ttl_s`` ago,
    else a fresh ``load()`` (whose exceptions reach the caller, nothing cached)."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._lock = threading.Lock()
        self._values: dict[K, tuple[float, V]] = {}
        self._loading: dict[K, threading.Lock] = {}

    def _fresh(self, key: K) -> tuple[bool, V | None]:
        with self._lock:
            hit = self._values.get(key)
            if hit is not None and hit[0] > self.clock():
                return True, hit[1]
            return False, None

    def get(self, key: K, load: Callable[[], V]) -> V:
        found, value = self._fresh(key)
        if found:
            return value  # type: ignore[return-value]
        with self._lock:
            loading = self._loading.setdefault(key, threading.Lock())
        with loading:
            found, value = self._fresh(key)  # another reader loaded it meanwhile
            if found:
                return value  # type: ignore[return-value]
            fresh = load()
            with self._lock:
                now = self.clock()
                # Expired entries go as new ones come (a namespace deleted is never asked
                # for again), and so does the key's loading lock: a reader still waiting
                # on it finds the value stored.
                self._values = {k: v for k, v in self._values.items() if v[0] > now}
                self._values[key] = (now + self.ttl_s, fresh)
                self._loading.pop(key, None)
            return fresh

    def forget(self) -> None:
        """Empty the cache (tests, or after a change the caller made itself)."""
        with self._lock:
            self._values.clear()
