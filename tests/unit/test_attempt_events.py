"""Which events are an attempt's, and how its events.log grows (liveness/attempt_events.py).
The edge (the API server in, the claim out) runs in the e2e tier's OOM-killed job."""

from __future__ import annotations

from typing import Any

import pytest

from grpo_trainer.liveness.attempt_events import (
    attempt_windows,
    event_line,
    events_of,
    merged,
)

pytestmark = pytest.mark.unit

ATTEMPTS = [{"index": 1, "startTime": "2026-12-04T10:05:00.250Z"},
            {"index": 0, "startTime": "2026-12-04T10:00:00.700Z",
             "endTime": "2026-12-04T10:04:50Z"}]


def event(kind: str, name: str, when: str, reason: str = "R", message: str = "m",
          **extra: Any) -> dict[str, Any]:
    return {"involvedObject": {"kind": kind, "name": name}, "lastTimestamp": when,
            "type": "Normal", "reason": reason, "message": message, **extra}


def test_a_jobs_own_events_belong_to_the_attempt_running_until_the_next_one_starts() -> None:
    first, second = attempt_windows(ATTEMPTS)
    events = [
        event("GRPOJob", "tiny", "2026-12-04T09:59:59Z", "Early"),   # before attempt 0
        event("GRPOJob", "tiny", "2026-12-04T10:00:00Z", "Planned"),  # posted at .700
        event("GRPOJob", "tiny", "2026-12-04T10:04:55Z", "Restarting"),  # after its end
        event("GRPOJob", "tiny", "2026-12-04T10:05:00Z", "Planned"),  # attempt 1's
        event("GRPOJob", "other", "2026-12-04T10:01:00Z", "NotOurs"),
    ]
    assert [line.split()[2] for line in events_of(events, "tiny", first)] == \
        ["Planned", "Restarting"]
    assert [line.split()[2] for line in events_of(events, "tiny", second)] == ["Planned"]


def test_the_attempts_cluster_and_pods_events_are_its_whenever_they_happened() -> None:
    first, second = attempt_windows(ATTEMPTS)
    events = [
        event("Pod", "tiny-a0-worker-x1", "2026-12-04T10:30:00Z", "OOMKilling"),
        event("Pod", "tiny-a0-head-abc", "2026-12-04T10:00:30Z", "Started"),
        event("RayCluster", "tiny-a0", "2026-12-04T10:00:02Z", "CreatedService"),
        event("Pod", "tiny-a01-head", "2026-12-04T10:00:30Z", "OtherJob"),  # job tiny-a01's
        event("RayCluster", "tiny-a1", "2026-12-04T10:05:02Z", "CreatedService"),
    ]
    assert [line.split()[2] for line in events_of(events, "tiny", first)] == \
        ["CreatedService", "Started", "OOMKilling"]  # oldest first
    assert [line.split()[3].rstrip(":") for line in events_of(events, "tiny", second)] == \
        ["RayCluster/tiny-a1"]


def test_a_line_says_when_what_and_how_often_on_one_line() -> None:
    line = event_line(event("Pod", "p", "2026-12-04T10:00:30+00:00", "BackOff",
                            "Back-off\n restarting", count=3, type="Warning"))
    assert line == "2026-12-04T10:00:30Z Warning BackOff Pod/p (x3): Back-off restarting"
    newer_api = {"regarding": {"kind": "Pod", "name": "p"}, "note": "n", "reason": "R",
                 "type": "Normal", "eventTime": "2026-12-04T10:00:30.123456Z"}
    assert event_line(newer_api) == "2026-12-04T10:00:30Z Normal R Pod/p: n"


def test_a_file_is_merged_never_replaced() -> None:
    kept = "2026-12-04T10:00:01Z Normal A GRPOJob/tiny: a\n"
    later = ["2026-12-04T10:00:02Z Normal B GRPOJob/tiny: b",
             "2026-12-04T10:00:00Z Normal C Pod/tiny-a0-head: c"]
    text = merged(kept, later)
    assert text.splitlines() == [later[1], kept.strip(), later[0]]
    # The API server dropped its old events by the time of a later write: none is lost.
    assert merged(text, [later[0]]) == text
    assert merged("", []) == ""
