"""Injected timing fault, for tests/cluster/test_operator_start.py only: put this folder
first on the operator process's PYTHONPATH and set GRPO_TEST_KOPF_NAMESPACE_WATCH_DELAY_S.

Kopf's namespace observer lists namespaces, then starts a watch stream that lists them
again. The gap between the two listings is milliseconds (6-20 ms measured at load 12),
too short to hit on demand; this widens it by sleeping before the watch stream starts,
so that a namespace created in the gap is certain."""

import asyncio
import os

from kopf._core.reactor import queueing

_DELAY_S = float(os.environ.get("GRPO_TEST_KOPF_NAMESPACE_WATCH_DELAY_S", "0"))
_watcher = queueing.watcher


async def _delayed_watcher(**kwargs):  # type: ignore[no-untyped-def]
    if _DELAY_S and kwargs["resource"].plural == "namespaces":
        print(f"INJECTED FAULT: the namespace watch starts {_DELAY_S} s late", flush=True)
        await asyncio.sleep(_DELAY_S)
    return await _watcher(**kwargs)


queueing.watcher = _delayed_watcher
