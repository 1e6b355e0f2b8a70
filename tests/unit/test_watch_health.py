"""/healthz's verdict on the operator's watch streams (watch_health.py)."""

from __future__ import annotations

import pytest

from grpo_operator.discovery import REQUIRED
from grpo_operator.watch_health import (
    StreamKey,
    StreamState,
    watch_verdict,
)

pytestmark = pytest.mark.unit

KINDS = [w.name for w in REQUIRED]
STALE = 150.0


def live(kind: str, at: float, ns: str | None = "op-a") -> tuple[StreamKey, StreamState]:
    return StreamKey(kind, ns), StreamState(opened_at=0.0, last_life_at=at)


def test_the_required_kinds_are_grpojobs_pods_and_rayclusters() -> None:
    assert KINDS == ["grpojobs.grpo.dev", "pods", "rayclusters.ray.io"]


def test_every_kind_streaming_recently_is_healthy() -> None:
    streams = dict(live(k, at=1000.0) for k in [*KINDS, "namespaces"])
    verdict = watch_verdict(1100.0, 0.0, streams, KINDS, namespaces=1, stale_after_s=STALE)
    assert verdict.healthy, verdict.detail


def test_a_kind_kopf_never_watched_fails_once_the_start_grace_is_over() -> None:
    """The silent start: Kopf's scan missed GRPOJobs, so no stream for them exists."""
    streams = dict(live(k, at=100.0) for k in ["pods", "rayclusters.ray.io", "namespaces"])
    assert watch_verdict(100.0, 0.0, streams, KINDS, 1, STALE).healthy  # still starting
    verdict = watch_verdict(151.0, 0.0, streams, KINDS, 1, STALE)
    assert not verdict.healthy
    assert "grpojobs.grpo.dev: no watch stream ever started" in verdict.detail


def test_streams_that_stopped_delivering_fail_and_say_for_how_long() -> None:
    """A partition: the streams exist, but their reconnects get no answer. One live
    stream of a kind is enough for that kind."""
    streams = dict(live(k, at=1000.0) for k in [*KINDS, "namespaces"])
    streams[StreamKey("pods", "op-b")] = StreamState(opened_at=0.0, last_life_at=1290.0)
    assert watch_verdict(1140.0, 0.0, streams, KINDS, 2, STALE).healthy
    verdict = watch_verdict(1300.0, 0.0, streams, KINDS, 2, STALE)
    assert not verdict.healthy
    assert "grpojobs.grpo.dev: no answer from its watch streams for 300 s" in verdict.detail
    assert "pods:" not in verdict.detail


def test_a_stream_that_opened_but_never_delivered_counts_from_its_opening() -> None:
    streams = dict(live(k, at=1000.0) for k in ["pods", "rayclusters.ray.io", "namespaces"])
    streams[StreamKey("grpojobs.grpo.dev", "op-a")] = StreamState(opened_at=900.0)
    assert watch_verdict(1040.0, 0.0, streams, KINDS, 1, STALE).healthy
    assert not watch_verdict(1060.0, 0.0, streams, KINDS, 1, STALE).healthy


def test_a_namespace_pattern_that_matches_nothing_needs_only_the_namespace_stream() -> None:
    streams = dict([live("namespaces", at=1000.0, ns=None)])
    assert watch_verdict(1100.0, 0.0, streams, KINDS, namespaces=0, stale_after_s=STALE).healthy
    verdict = watch_verdict(1200.0, 0.0, streams, KINDS, namespaces=0, stale_after_s=STALE)
    assert not verdict.healthy and "namespaces:" in verdict.detail


def test_cluster_wide_operators_have_no_namespace_stream_to_require() -> None:
    streams = dict(live(k, at=1000.0, ns=None) for k in KINDS)
    assert watch_verdict(1100.0, 0.0, streams, KINDS, namespaces=None,
                         stale_after_s=STALE).healthy


def test_a_standby_replica_is_healthy_and_says_why() -> None:
    """Kopf peering closes a standby replica's streams on purpose."""
    verdict = watch_verdict(5000.0, 0.0, {}, KINDS, 1, STALE, standby=True)
    assert verdict.healthy and verdict.detail.startswith("standby:")


def test_after_standby_the_start_grace_counts_from_the_takeover() -> None:
    """Streams last alive before the pause (1000 s), standby until 4900 s: taking over
    at 5000 s is no failure, but streams that never answer fail a grace later."""
    streams = dict(live(k, at=1000.0) for k in [*KINDS, "namespaces"])
    assert watch_verdict(5000.0, 4900.0, streams, KINDS, 1, STALE).healthy
    assert not watch_verdict(5060.0, 4900.0, streams, KINDS, 1, STALE).healthy
