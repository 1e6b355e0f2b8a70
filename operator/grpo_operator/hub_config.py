"""Thin HTTP edge: a hub repo's config.json, for admission, reconcile and `grpo plan`.

One GET (grpo_api.model_config.read_url, short timeout), answers cached by URL (the
endpoint, repo and revision make it): a job is checked at apply and planned right after,
and many jobs of one model read it once. A failed read is kept only briefly, so a retry
after RETRY_SECONDS asks the hub again. The operator reads public repos only (a private
one is read by a pod with the job's Secret); `grpo plan` passes the user's token for a
job that names one, sent as the reader pod sends it (read_url's Authorization header).
"""

from __future__ import annotations

import hashlib
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
    try:
        answer = HubAnswer(url, config=shape_fields(read_url(url, token)))
    except ConfigUnavailable as exc:
        answer = HubAnswer(url, error=str(exc), retry=exc.retry)
    ttl = OK_TTL_S if answer.config is not None else FAILED_TTL_S
    with _lock:
        if len(_cache) >= MAX_ENTRIES:
            _cache.pop(next(iter(_cache)))  # the oldest entry
        _cache[key] = (clock() + ttl, answer)
    return answer


def forget() -> None:
    """Empty the cache (tests)."""
    with _lock:
        _cache.clear()
