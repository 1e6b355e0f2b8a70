"""The Kubernetes events of a job's attempts, kept beside their logs on the checkpoint claim.

Events live an hour on the API server (its `--event-ttl`) and the operator cannot write
to the claim, so the trainer keeps them: a driver starting attempt n writes the events of
every earlier attempt to `attempts/<k>/events.log`, and the driver of attempt n writes its
own when it ends (success or a failure it lives through). An attempt whose pods were
killed gets its file from the next attempt; the last attempt's file lacks what happened
after its driver exited (the operator's last events on the job).

An event belongs to attempt k when it is about the attempt's RayCluster (`<job>-a<k>`)
or one of its pods (`<job>-a<k>-...`), or about the GRPOJob itself between attempt k's
start and attempt k+1's. A file is merged, never replaced: lines already kept stay, so
a later write after the API server dropped old events loses nothing.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from grpo_api.contract import (
    API_GROUP,
    API_VERSION,
    ATTEMPT_EVENTS,
    KIND,
    PLURAL,
    attempt_dir,
    ray_cluster_name,
)
from grpo_api.trainer_config import Config

from .kube_progress import job_in_cluster

log = logging.getLogger(__name__)

# (connect, read) seconds: an API server that does not answer delays a start or a SIGTERM
# save's exit by this much at most, never more.
API_TIMEOUT_S = (5.0, 20.0)


@dataclass(frozen=True)
class AttemptWindow:
    """Attempt `index` and when the GRPOJob's own events count as its: from its start to
    the next attempt's start (None: open)."""

    index: int
    start: datetime | None
    end: datetime | None


def _time(text: object) -> datetime | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def attempt_windows(attempts: Sequence[Mapping[str, Any]]) -> list[AttemptWindow]:
    """status.attempts (wire form) as windows, each closed by the next one's start."""
    ordered = sorted(attempts, key=lambda a: int(a.get("index", 0)))
    # To the second: an event's lastTimestamp has no fraction (metav1.Time), so the event
    # the operator posts as it starts an attempt may read as a moment before its start.
    starts = [when.replace(microsecond=0) if (when := _time(a.get("startTime"))) else None
              for a in ordered]
    return [AttemptWindow(int(a.get("index", 0)), starts[i],
                          starts[i + 1] if i + 1 < len(ordered) else None)
            for i, a in enumerate(ordered)]


def event_time(event: Mapping[str, Any]) -> datetime | None:
    """When it last happened: core/v1 events carry lastTimestamp, events.k8s.io ones
    eventTime (series ones both)."""
    series = event.get("series") or {}
    for key in (series.get("lastObservedTime"), event.get("lastTimestamp"),
                event.get("eventTime"), event.get("firstTimestamp"),
                (event.get("metadata") or {}).get("creationTimestamp")):
        if (when := _time(key)) is not None:
            return when
    return None


def belongs_to(event: Mapping[str, Any], job: str, window: AttemptWindow) -> bool:
    obj = event.get("involvedObject") or event.get("regarding") or {}
    kind, name = obj.get("kind"), str(obj.get("name", ""))
    cluster = ray_cluster_name(job, window.index)
    if kind == "RayCluster":
        return name == cluster
    if kind == "Pod":
        return name.startswith(cluster + "-")
    if kind == KIND and name == job:
        when = event_time(event)
        if when is None or window.start is None:
            return False
        return window.start <= when and (window.end is None or when < window.end)
    return False


def event_line(event: Mapping[str, Any]) -> str:
    """One line a person reads: `<time> <type> <reason> <Kind>/<name> (xN): <message>`."""
    obj = event.get("involvedObject") or event.get("regarding") or {}
    when = event_time(event)
    count = int(event.get("count") or (event.get("series") or {}).get("count") or 1)
    times = f" (x{count})" if count > 1 else ""
    message = " ".join(str(event.get("message") or event.get("note") or "").split())
    stamp = when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if when else "-"
    return (f"{stamp} {event.get('type', '')} "
            f"{event.get('reason', '')} {obj.get('kind', '')}/{obj.get('name', '')}"
            f"{times}: {message}")


def events_of(events: Iterable[Mapping[str, Any]], job: str, window: AttemptWindow) -> list[str]:
    """The lines of attempt `window.index`'s events, oldest first."""
    mine = [e for e in events if belongs_to(e, job, window)]
    mine.sort(key=lambda e: when.timestamp() if (when := event_time(e)) else float("-inf"))
    return [event_line(e) for e in mine]


def merged(kept: str, lines: Sequence[str]) -> str:
    """`kept` (a file's text) with `lines` added: nothing kept is dropped, nothing doubled;
    ordered by the lines' leading timestamps (ISO 8601, so text order is time order)."""
    union = dict.fromkeys([*kept.splitlines(), *lines])
    union.pop("", None)
    return "".join(f"{line}\n" for line in sorted(union))


# The edge: the API server in, the claim out.


def _write_merged(path: Path, lines: Sequence[str]) -> None:
    kept = path.read_text(errors="replace") if path.exists() else ""
    text = merged(kept, lines)
    if text == kept:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)  # a reader never sees half a file


def _apis() -> tuple[Any, Any]:
    from kubernetes import client, config  # slow to import: only in a pod of a GRPOJob

    config.load_incluster_config()
    return client.CoreV1Api(), client.CustomObjectsApi()


def keep_attempt_events(cfg: Config, attempts: Iterable[int]) -> list[Path]:
    """In a GRPOJob's pod: write the events of `attempts` of the job beside their logs;
    the files written. Never raises: kept events are a convenience, training goes on
    without them."""
    wanted = set(attempts)
    job_ref = job_in_cluster(cfg)
    if not (wanted and cfg.checkpoint.dir and job_ref):
        return []
    namespace, name = job_ref
    try:
        core, custom = _apis()
        job = custom.get_namespaced_custom_object_status(
            API_GROUP, API_VERSION, namespace, PLURAL, name, _request_timeout=API_TIMEOUT_S)
        windows = [w for w in attempt_windows((job.get("status") or {}).get("attempts") or [])
                   if w.index in wanted]
        raw = core.list_namespaced_event(namespace, _preload_content=False,
                                         _request_timeout=API_TIMEOUT_S)
        events = json.loads(raw.data).get("items") or []
        written = []
        for window in windows:
            path = Path(attempt_dir(cfg.checkpoint.dir, window.index)) / ATTEMPT_EVENTS
            _write_merged(path, events_of(events, name, window))
            written.append(path)
        log.info("kept the events of attempt(s) %s: %s", sorted(w.index for w in windows),
                 ", ".join(map(str, written)))
        return written
    except Exception as err:  # the API server away, a Role without events: logs say so
        log.warning("keeping the events of attempt(s) %s failed: %s", sorted(wanted), err)
        return []
