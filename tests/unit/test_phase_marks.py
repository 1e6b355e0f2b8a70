"""The driver's phase marks reach status.progress (phase, phaseAt) between step reports:
the operator's progress deadline counts from them."""

from __future__ import annotations

from typing import Any

from grpo_testbed.status_patch import apply_status_patch
from grpo_trainer.liveness.kube_progress import KubernetesProgressReporter
from grpo_trainer.liveness.progress import Progress
from grpo_trainer.liveness.stall import Heartbeat


class RecordingStatusApi:
    """Stands in for the API server's status subresource: keeps each merge patch."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []

    def patch_namespaced_custom_object_status(self, *args: Any, **kw: Any) -> None:
        self.patches.append(args[5])


def test_a_phase_mark_patches_only_phase_and_its_time_and_the_crd_takes_it() -> None:
    api = RecordingStatusApi()
    reporter = KubernetesProgressReporter("ns", "j", api=api)
    reporter.report(Progress(3, 10, 0.5, 2), force=True)
    reporter.phase("rollout")  # right after a step report: its own rate limit
    assert len(api.patches) == 2
    mark = api.patches[1]["status"]["progress"]
    assert set(mark) == {"phase", "phaseAt"} and mark["phase"] == "rollout"
    status: dict[str, Any] = {}
    for patch in api.patches:
        status = apply_status_patch(status, patch["status"])
    # The mark keeps what the step report said (a merge patch of two fields).
    assert status["progress"]["step"] == 3 and status["progress"]["lastCheckpointStep"] == 2
    assert status["progress"]["phaseAt"] == mark["phaseAt"]


def test_phase_marks_are_rate_limited_like_step_reports() -> None:
    api = RecordingStatusApi()
    reporter = KubernetesProgressReporter("ns", "j", api=api, min_interval_s=3600)
    reporter.phase("rollout")
    reporter.phase("reward")
    assert [p["status"]["progress"]["phase"] for p in api.patches] == ["rollout"]


def test_the_heartbeat_publishes_every_mark() -> None:
    seen: list[str] = []
    beat = Heartbeat(published=seen.append)
    beat.mark("rollout")
    beat.mark("update")
    beat.step_done(1, 2.0)  # the step report follows a finished step: no mark
    assert seen == ["rollout", "update"]
