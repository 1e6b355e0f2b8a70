"""The only module that reaches into Kopf's internals (kopf 1.45.2, pinned in every lock;
tests/unit/test_kopf_fixes.py fails on an upgrade that moves what is patched here).

1. Namespaces created while the operator starts were never watched. Kopf's namespace
   observer lists the namespaces once, then starts a watch stream that lists them again
   and ignores every event of that second listing (type None), as it should for
   resources whose first listing it already has. A namespace created between the two
   listings is in neither the first listing nor the watch's events: no GRPOJob, pod or
   RayCluster stream is ever started for it, and its jobs get no status, while webhooks
   and /healthz answer. `see_listed_namespaces` makes the observer revise its namespaces
   on listed events too (revising is idempotent).
2. /healthz must know whether watch streams are alive (watch_health.py), which no
   handler can see (an idle stream delivers nothing; Kopf drops bookmarks and reconnects
   silently): `track_watches` wraps the generator every watch stream goes through and
   the request that (re)opens it. It also hands the tracker Kopf's pause toggles, which
   say whether peering holds this replica in standby (healthy, watching nothing).
"""

from __future__ import annotations

import contextvars
import functools
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from kopf._cogs.aiokits.aiotoggles import Toggle
from kopf._cogs.clients import api, watching
from kopf._cogs.structs.references import Insights
from kopf._core.reactor import observation

from .watch_health import StreamKey, WatchTracker, resource_name

__all__ = ["Insights", "in_standby", "see_listed_namespaces", "track_watches"]

# The stream a watcher task is running: Kopf runs each stream in a task of its own, and
# the generator's body runs in that task's context.
_STREAM: contextvars.ContextVar[StreamKey | None] = contextvars.ContextVar(
    "grpo_watch_stream", default=None)


_ORIGINAL = "_grpo_replaces"  # on our wrappers: the function each replaced


def _unwrapped(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function our wrapper replaced (patching twice wraps once). Not `__wrapped__`:
    Kopf's own decorators set that (api.request's points past its authentication)."""
    return getattr(fn, _ORIGINAL, fn)


def _replacing(original: Callable[..., Any], wrapper: Callable[..., Any]) -> Callable[..., Any]:
    functools.update_wrapper(wrapper, original)
    del wrapper.__wrapped__  # type: ignore[attr-defined]
    setattr(wrapper, _ORIGINAL, original)
    return wrapper


def see_listed_namespaces() -> None:
    """Kopf's namespace observer, revising its namespaces from listed events as well."""
    original = _unwrapped(observation.process_discovered_namespace_event)

    async def process_namespace_event(*, raw_event: Any, namespaces: Any, insights: Insights,
                                      **kwargs: Any) -> None:
        if raw_event["type"] is None:
            raw_event = {**raw_event, "type": "ADDED"}  # a listed namespace exists
        await original(raw_event=raw_event, namespaces=namespaces, insights=insights, **kwargs)

    observation.process_discovered_namespace_event = _replacing(original,
                                                                process_namespace_event)


# Kopf's name of the pause toggle it sets while a mandatory peering's CRD is absent
# (kopf/_core/reactor/orchestration.py). Its other pause toggles are one per peering
# object: on while a live peer outranks this replica (or ties with it).
PEERING_CRD_MISSING = "peering CRD is missing"


def in_standby(pause_toggles: Iterable[Toggle]) -> bool:
    """Paused by peering, and only by peering: another replica reconciles. A replica
    paused because the peering CRD is absent is not standing by for anyone."""
    on = [t for t in pause_toggles if t.is_on()]
    return bool(on) and all(t.name != PEERING_CRD_MISSING for t in on)


def track_watches(tracker: WatchTracker) -> None:
    """Every watch stream (resources, namespaces, CRDs) reports to `tracker` when it
    opens, each time the API server answers its watch request (the first and every
    reconnect) or it delivers anything, and when it closes."""
    original_stream = _unwrapped(watching.infinite_watch)
    original_request = _unwrapped(api.request)

    async def infinite_watch(**kwargs: Any) -> AsyncIterator[Any]:
        resource, namespace = kwargs["resource"], kwargs["namespace"]
        key = StreamKey(resource_name(resource.plural, resource.group), namespace)
        paused = kwargs.get("operator_paused")  # the same ToggleSet for every resource
        if paused is not None:
            tracker.in_standby = lambda: in_standby(paused)
        _STREAM.set(key)
        tracker.opened(key)
        try:
            async for item in original_stream(**kwargs):
                tracker.alive(key)
                yield item
        finally:
            tracker.closed(key)

    async def request(*args: Any, **kwargs: Any) -> Any:
        response = await original_request(*args, **kwargs)  # raises unless answered 2xx
        key = _STREAM.get()
        if key is not None and "watch=true" in str(kwargs.get("url", "")):
            tracker.alive(key)
        return response

    watching.infinite_watch = _replacing(original_stream, infinite_watch)
    api.request = _replacing(original_request, request)
