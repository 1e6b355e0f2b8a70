"""Thin HTTP edge: a public hub repo's config.json, for admission and reconcile.

One GET (grpo_api.model_config.read_url, short timeout), answers cached by URL (the
endpoint, repo and revision make it): a job is checked at apply and planned right after,
and many jobs of one model read it once. A failed read is kept only briefly, so a retry
after RETRY_SECONDS asks the hub again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from grpo_api.model_config import ConfigUnavailable, read_url, shape_fields

from .reconcile import HubAnswer

OK_TTL_S = 600.0
FAILED_TTL_S = 10.0
MAX_ENTRIES = 256

_lock = threading.Lock()
_cache: dict[str, tuple[float, HubAnswer]] = {}


def read(url: str, clock: Callable[[], float] = time.monotonic) -> HubAnswer:
    """The hub's answer for `url`, from the cache while it is fresh."""
    now = clock()
    with _lock:
        hit = _cache.get(url)
    if hit is not None and hit[0] > now:
        return hit[1]
    try:
        answer = HubAnswer(url, config=shape_fields(read_url(url)))
    except ConfigUnavailable as exc:
        answer = HubAnswer(url, error=str(exc), retry=exc.retry)
    ttl = OK_TTL_S if answer.config is not None else FAILED_TTL_S
    with _lock:
        if len(_cache) >= MAX_ENTRIES:
            _cache.pop(next(iter(_cache)))  # the oldest entry
        _cache[url] = (clock() + ttl, answer)
    return answer


def forget() -> None:
    """Empty the cache (tests)."""
    with _lock:
        _cache.clear()
