"""The driver's stage marks reach status.progress (stage, stageAt) between step reports:
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


def test_a_stage_mark_patches_only_stage_and_its_time_and_the_crd_takes_it() -> None:
    api = RecordingStatusApi()
    reporter = KubernetesProgressReporter("ns", "j", api=api)
    reporter.report(Progress(3, 10, 0.5, 2), force=True)
    reporter.stage_entered("rollout")  # right after a step report: its own rate limit
    assert len(api.patches) == 2
    mark = api.patches[1]["status"]["progress"]
    assert set(mark) == {"stage", "stageAt"} and mark["stage"] == "rollout"
    status: dict[str, Any] = {}
    for patch in api.patches:
        status = apply_status_patch(status, patch["status"])
    # The mark keeps what the step report said (a merge patch of two fields).
    assert status["progress"]["step"] == 3 and status["progress"]["lastCheckpointStep"] == 2
    assert status["progress"]["stageAt"] == mark["stageAt"]


def test_stage_marks_are_rate_limited_like_step_reports() -> None:
    api = RecordingStatusApi()
    reporter = KubernetesProgressReporter("ns", "j", api=api, min_interval_s=3600)
    reporter.stage_entered("rollout")
    reporter.stage_entered("reward")
    assert [p["status"]["progress"]["stage"] for p in api.patches] == ["rollout"]


def test_the_heartbeat_publishes_every_mark() -> None:
    seen: list[str] = []
    beat = Heartbeat(published=seen.append)
    beat.mark("rollout")
    beat.mark("update")
    beat.step_done(1, 2.0)  # the step report follows a finished step: no mark
    assert seen == ["rollout", "update"]
