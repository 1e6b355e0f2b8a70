"""Is the operator watching what it must? The liveness behind `/healthz`.

An operator that serves its webhooks and answers probes but holds no watch stream
reconciles nothing, and Kubernetes would never restart it (docs/troubleshooting.md,
"The operator logs nothing"). So `/healthz` fails when a kind the operator must watch
(GRPOJobs, pods, RayClusters) has had no live watch stream for `stale_after_s`.

A stream shows life when the API server answers its watch request or when it delivers
something (an event, the end of its listing, a bookmark). An idle stream delivers
nothing (measured: no bookmark in 130 s on an empty custom resource), but Kopf
reconnects a stream that is silent for 70 s, and each answered reconnect is a sign of
life; a stream cut off from the API server gets no answer. The verdict is a pure
function of what the tracker saw; kopf_fixes.track_watches feeds the tracker.

A standby replica (Kopf peering paused it: another replica reconciles) holds no watch
stream by design and is healthy: it serves the admission webhooks. Its time in standby
counts as life, so that it is not failed in the moments after it takes over, before its
streams have answered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

# An idle stream shows life at least every ~70 s (Kopf's inactivity reconnect): 150 s is
# two missed reconnects, never a healthy idle stream.
DEFAULT_STALE_AFTER_S = 150.0


@dataclass(frozen=True)
class StreamKey:
    """One watch stream: a resource (``plural.group``, core kinds as ``pods``) in one
    namespace, or cluster-wide (None)."""

    resource: str
    namespace: str | None


@dataclass
class StreamState:
    opened_at: float
    last_life_at: float | None = None  # its watch request answered, or anything delivered
    open: bool = True


@dataclass(frozen=True)
class Verdict:
    healthy: bool
    detail: str


def resource_name(plural: str, group: str) -> str:
    """How a kind is named here and in messages: ``grpojobs.grpo.dev``, ``pods``."""
    return f"{plural}.{group}" if group else plural


STANDBY = ("standby: another replica of the peering reconciles; this one serves the "
           "admission webhooks and takes over when that one leaves")


def watch_verdict(now: float, started_at: float, streams: Mapping[StreamKey, StreamState],
                  required: Collection[str], namespaces: int | None,
                  stale_after_s: float = DEFAULT_STALE_AFTER_S,
                  standby: bool = False) -> Verdict:
    """Healthy when every required kind had a live stream within `stale_after_s`,
    or when the operator is a standby replica (then it watches nothing on purpose).

    `namespaces` is how many namespaces the operator serves (None: cluster-wide). With
    none (a namespace pattern that matches nothing yet) there is nothing to watch but
    the namespaces themselves, so only that stream must be live. During the first
    `stale_after_s` after start (or after standby ended: `started_at` is then the last
    moment seen in standby), a kind without a stream yet is not a failure.
    """
    if standby:
        return Verdict(True, STANDBY)
    wanted = list(required) if namespaces != 0 else []
    wanted += ["namespaces"] if namespaces is not None else []
    stale: list[str] = []
    for kind in wanted:
        seen = [s.last_life_at or s.opened_at for k, s in streams.items()
                if k.resource == kind]
        last = max([*seen, started_at])
        if now - last > stale_after_s:
            stale.append(f"{kind}: " + (f"no answer from its watch streams for {now - last:.0f}"
                                         " s" if seen else "no watch stream ever started"))
    if stale:
        return Verdict(False, "not watching: " + "; ".join(stale) + f" (limit {stale_after_s:.0f}"
                       " s). A restart makes the operator discover the API and watch again.")
    live = sum(1 for s in streams.values() if s.open)
    return Verdict(True, f"ok: {live} watch streams open")


@dataclass
class WatchTracker:
    """What Kopf's watch streams delivered, and when (monotonic seconds)."""

    started_at: float = field(default_factory=time.monotonic)
    streams: dict[StreamKey, StreamState] = field(default_factory=dict)
    # Whether Kopf's peering holds this replica in standby (set by kopf_fixes).
    in_standby: Callable[[], bool] = lambda: False
    standby_seen_at: float | None = None

    def opened(self, key: StreamKey) -> None:
        self.streams[key] = StreamState(opened_at=time.monotonic())

    def alive(self, key: StreamKey) -> None:
        """The stream's watch request was answered, or it delivered something."""
        state = self.streams.get(key)
        if state is not None:
            state.last_life_at = time.monotonic()

    def closed(self, key: StreamKey) -> None:
        state = self.streams.get(key)
        if state is not None:
            state.open = False

    def verdict(self, required: Collection[str], namespaces: int | None,
                stale_after_s: float) -> Verdict:
        now = time.monotonic()
        standby = self.in_standby()
        if standby:
            self.standby_seen_at = now
        since = max(self.started_at, self.standby_seen_at or self.started_at)
        return watch_verdict(now, since, self.streams, required, namespaces, stale_after_s,
                             standby=standby)
