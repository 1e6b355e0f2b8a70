"""The webhook's serving certificate, watched. Kopf loads it once, when its server
starts; a renewed one (cert-manager's, or the chart's rotation at an upgrade) reaches the
mounted files later. So the operator looks at them every `interval` seconds and, once
they changed, stops itself (SIGTERM: Kopf's own graceful exit) for Kubernetes to start it
again with the new certificate. Each replica waits a random part of one interval first,
so that two replicas seldom restart at once and admission keeps an answer."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger("grpo_operator")

CHECK_INTERVAL_S = 30.0  # --webhook-cert-check


def digest(paths: Sequence[str]) -> str | None:
    """One digest of the files' contents; None while any cannot be read (a Secret volume
    being swapped: its files come back at once)."""
    h = hashlib.sha256()
    try:
        for p in paths:
            h.update(Path(p).read_bytes())
    except OSError:
        return None
    return h.hexdigest()


async def watch_certificate(paths: Sequence[str], stop: Callable[[str], None],
                            interval: float = CHECK_INTERVAL_S) -> None:
    """Returns after calling `stop(why)` once the files' contents changed."""
    first = digest(paths)
    while True:
        await asyncio.sleep(interval)
        now = digest(paths)
        if first is None:
            first = now
            continue
        if now is None or now == first:
            continue
        wait = random.uniform(0, interval)
        why = (f"the webhook certificate ({', '.join(paths)}) was renewed; restarting in "
               f"{wait:.0f} s to serve the new one")
        log.warning(why)
        await asyncio.sleep(wait)
        stop(why)
        return
