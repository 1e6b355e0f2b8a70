"""What kopf_fixes.py changes in Kopf, against the pinned kopf (1.45.2): an upgrade that
moves what is patched fails here, not silently in a cluster."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kopf._cogs.clients import api, watching
from kopf._cogs.structs.references import Resource
from kopf._core.reactor import observation, queueing

from grpo_operator.kopf_fixes import Insights, see_listed_namespaces, track_watches
from grpo_operator.watch_health import StreamKey, WatchTracker

pytestmark = pytest.mark.unit


def namespace_event(name: str, type_: str | None) -> dict[str, Any]:
    return {"type": type_, "object": {"metadata": {"name": name}}}


async def observe(events: list[dict[str, Any]], kopf_own: bool = False) -> set[Any]:
    """Feed events to the processor Kopf's namespace observer binds (it looks the name up
    in `observation` when it starts), as its watch stream would."""
    process = observation.process_discovered_namespace_event
    if kopf_own:
        process = getattr(process, "__wrapped__", process)
    insights = Insights()
    for event in events:
        await process(raw_event=event, namespaces=["op-*"], insights=insights)
    return insights.namespaces


def test_kopf_alone_ignores_a_namespace_its_watch_only_lists() -> None:
    """The race's mechanism, in Kopf as shipped: a namespace created between the
    observer's first listing and its watch's own listing arrives as a listed event."""
    assert asyncio.run(observe([namespace_event("op-a", None)], kopf_own=True)) == set()


def test_listed_namespaces_are_watched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(observation, "process_discovered_namespace_event",
                        observation.process_discovered_namespace_event)
    see_listed_namespaces()
    see_listed_namespaces()  # idempotent: wraps Kopf's function once
    seen = asyncio.run(observe([namespace_event("op-a", None), namespace_event("op-a", None),
                                namespace_event("kube-system", None),
                                namespace_event("op-b", "ADDED")]))
    assert seen == {"op-a", "op-b"}  # the pattern still decides
    deleted = asyncio.run(observe([namespace_event("op-a", None),
                                   namespace_event("op-a", "DELETED")]))
    assert deleted == set()


def test_every_watch_stream_reports_to_the_tracker(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kopf's watcher (queueing.watcher) reads `watching.infinite_watch` at call time,
    keyword for keyword, and a stream (re)opens its watch with `api.request(url=...)`:
    the tracker sees a stream open, each answered watch request and each item, and its
    close. Other requests of the same task are not signs of life."""
    answered: list[str] = []

    async def request(**kwargs: Any) -> str:
        answered.append(kwargs["url"])
        return "response"

    async def stream(**kwargs: Any) -> AsyncIterator[Any]:
        await api.request(method="get", url="/api/v1/namespaces/op-a/pods?limit=500")
        assert tracker.streams[key].last_life_at is None  # a listing is not a watch
        await api.request(method="get", url="/api/v1/namespaces/op-a/pods?watch=true")
        assert tracker.streams[key].last_life_at is not None
        yield {"type": "BOOKMARK", "object": {}}

    monkeypatch.setattr(api, "request", request)
    monkeypatch.setattr(watching, "infinite_watch", stream)
    assert queueing.watching is watching
    tracker = WatchTracker(started_at=0.0)
    key = StreamKey("pods", "op-a")
    track_watches(tracker)
    track_watches(tracker)  # wraps the originals once
    pods = Resource(group="", version="v1", plural="pods", namespaced=True)

    async def consume() -> list[Any]:
        return [e async for e in watching.infinite_watch(
            settings=None, resource=pods, namespace="op-a", operator_paused=None)]

    assert len(asyncio.run(consume())) == 1 and len(answered) == 2
    assert not tracker.streams[key].open


def test_the_wrappers_call_exactly_what_they_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kopf's api.request is itself decorated (its `__wrapped__` skips the injection of
    the API session): our wrapper must call the decorated function, never unwrap it."""
    kopf_request, kopf_stream = api.request, watching.infinite_watch
    monkeypatch.setattr(api, "request", kopf_request)
    monkeypatch.setattr(watching, "infinite_watch", kopf_stream)
    track_watches(WatchTracker())
    track_watches(WatchTracker())
    assert api.request is not kopf_request
    assert api.request._grpo_replaces is kopf_request  # type: ignore[attr-defined]
    assert watching.infinite_watch._grpo_replaces is kopf_stream  # type: ignore[attr-defined]


def test_kopf_opens_a_watch_through_api_request_with_keywords() -> None:
    """What the request wrapper relies on: api.stream calls the module's `request`
    with the URL as a keyword (read from kopf's own source)."""
    import inspect

    source = inspect.getsource(api.stream)
    assert "response = await request(" in source and "url=url," in source


def test_a_replica_paused_by_its_peering_is_a_healthy_standby(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Kopf hands every resource watch the operator's pause toggles: while a live peer
    outranks this replica its streams are closed on purpose, and /healthz must not fail
    it (the kubelet would restart the standby replica forever). Paused only because
    the peering CRD is missing, nothing reconciles anywhere: that is no standby."""
    from kopf._cogs.aiokits import aiotoggles
    from kopf._core.reactor import orchestration

    from grpo_operator.discovery import REQUIRED
    from grpo_operator.kopf_fixes import PEERING_CRD_MISSING, in_standby

    assert f"make_toggle(name={PEERING_CRD_MISSING!r})" in inspect.getsource(
        orchestration.orchestrator)

    async def stream(**kwargs: Any) -> AsyncIterator[Any]:
        yield {"type": None, "object": {}}

    monkeypatch.setattr(watching, "infinite_watch", stream)
    tracker = WatchTracker(started_at=-1000.0)  # long past the start grace
    track_watches(tracker)
    kinds = [w.name for w in REQUIRED]

    async def run() -> list[bool]:
        paused = aiotoggles.ToggleSet(any)
        missing = await paused.make_toggle(False, name=PEERING_CRD_MISSING)
        outranked = await paused.make_toggle(True, name="grpo@op-a")
        pods = Resource(group="", version="v1", plural="pods", namespaced=True)
        async for _ in watching.infinite_watch(settings=None, resource=pods, namespace="op-a",
                                                operator_paused=paused):
            pass
        seen = [tracker.verdict(kinds, 1, 150.0).healthy]  # outranked: standby
        await outranked.turn_to(False)
        # Took over: its streams have not answered yet, but it was alive a moment ago.
        seen.append(tracker.verdict(kinds, 1, 150.0).healthy)
        await missing.turn_to(True)
        seen.append(in_standby(paused))
        return seen

    assert asyncio.run(run()) == [True, True, False]
    tracker.standby_seen_at = None  # long after: no stream has delivered since
    assert not tracker.verdict(kinds, 1, 150.0).healthy
