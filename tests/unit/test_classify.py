"""classify_pod on the pod status shapes the kubelet (and kwok) really write."""

from __future__ import annotations

import json
from typing import Any

import pytest

from grpo_api.contract import FailureReason as R
from grpo_operator.reconcile.classify import classify_pod


def pod(state: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    cs = [{"name": "ray-head", "ready": False, "restartCount": 0,
           "state": state or {"running": {"startedAt": "2026-11-21T10:00:00Z"}}}]
    return {"metadata": {"name": "job-a0-head-x"}, "spec": {"nodeName": "h100-0"},
            "status": {"phase": status.pop("phase", "Running"), "containerStatuses": cs,
                       **status}}


def terminated(code: int, reason: str, message: str = "") -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": reason, "message": message,
                           "startedAt": "2026-11-21T10:00:00Z",
                           "finishedAt": "2026-11-21T10:05:00Z"}}


def msg(**kw: Any) -> str:
    return json.dumps(kw)


CASES = [
    ("running", pod(), None, None),
    ("exit 0", pod(terminated(0, "Completed"), phase="Succeeded"), R.SUCCEEDED, None),
    ("kernel OOM kill", pod(terminated(137, "OOMKilled"), phase="Failed"), R.HOST_OOM, None),
    ("137 without message", pod(terminated(137, "Error"), phase="Failed"), R.HOST_OOM, None),
    ("cuda oom message", pod(terminated(3, "Error", msg(reason="CudaOOM", step=812,
                                                        lastCheckpointStep=800)),
                             phase="Failed"), R.CUDA_OOM, 812),
    ("exit 3 without message", pod(terminated(3, "Error"), phase="Failed"), R.CUDA_OOM, None),
    ("ray oom", pod(terminated(4, "Error", msg(reason="RayOOM", step=7)), phase="Failed"),
     R.RAY_OOM, 7),
    ("exit 4 without message", pod(terminated(4, "Error"), phase="Failed"), R.RAY_OOM, None),
    ("worker lost", pod(terminated(5, "Error", msg(reason="NodeLost", step=3)),
                        phase="Failed"), R.NODE_LOST, 3),
    ("config error", pod(terminated(2, "Error", msg(reason="ConfigError", step=0)),
                         phase="Failed"), R.CONFIG_ERROR, 0),
    ("unknown crash", pod(terminated(1, "Error", "Traceback ..."), phase="Failed"),
     R.ERROR, None),
    ("segfault", pod(terminated(139, "Error"), phase="Failed"), R.ERROR, None),
    ("evicted", {"metadata": {}, "spec": {}, "status": {
        "phase": "Failed", "reason": "Evicted",
        "message": "The node was low on resource: memory."}}, R.EVICTED, None),
    ("preempted", pod(conditions=[{"type": "DisruptionTarget", "status": "True",
                                   "reason": "PreemptionByScheduler",
                                   "message": "preempted by a higher-priority pod"}]),
     R.PREEMPTED, None),
    ("drained", pod(conditions=[{"type": "DisruptionTarget", "status": "True",
                                 "reason": "EvictionByEvictionAPI"}]), R.EVICTED, None),
]


@pytest.mark.parametrize(("name", "body", "want", "step"), CASES, ids=[c[0] for c in CASES])
def test_classify(name: str, body: dict[str, Any], want: R | None, step: int | None) -> None:
    out = classify_pod(body)
    if want is None:
        assert out is None
        return
    assert out is not None and out.reason is want
    assert out.step == step


def test_running_pod_deleted_is_node_lost_and_names_the_node() -> None:
    out = classify_pod(pod(), deleted=True)
    assert out is not None and out.reason is R.NODE_LOST and "h100-0" in out.message


def test_termination_message_detail_and_checkpoint_reach_the_outcome() -> None:
    out = classify_pod(pod(terminated(3, "Error", msg(
        reason="CudaOOM", step=812, lastCheckpointStep=800,
        detail="CUDA out of memory. Tried to allocate 2.00 GiB")), phase="Failed"))
    assert out is not None
    assert out.last_checkpoint_step == 800
    assert "CudaOOM at step 812" in out.message and "2.00 GiB" in out.message


def test_what_the_ranks_were_doing_when_they_failed_reaches_the_outcome() -> None:
    vllm_oom = msg(reason="CudaOOM", step=3, lastCheckpointStep=2, stage="rollout",
                   detail="CUDA Error: out of memory at cumem_allocator.cpp:62")
    out = classify_pod(pod(terminated(3, "Error", vllm_oom), phase="Failed"))
    assert out is not None and out.failed_during == "rollout"
    older = msg(reason="CudaOOM", step=3, phase="training")  # older trainer images' key
    out = classify_pod(pod(terminated(3, "Error", older), phase="Failed"))
    assert out is not None and out.failed_during == "training"
    unknown = msg(reason="CudaOOM", step=3, stage="compiling")  # a newer trainer's word
    out = classify_pod(pod(terminated(3, "Error", unknown), phase="Failed"))
    assert out is not None and out.reason == R.CUDA_OOM and out.failed_during is None
