"""Ray's failures map to the contract's exit codes (the operator classifies by them).

Ray's memory monitor and a lost actor cannot be provoked cheaply on a shared 2-core CI
machine; these build the exception objects Ray raises in those cases.
"""

from __future__ import annotations

from ray import exceptions as rex

from grpo_api.contract import ExitCode, FailureReason
from grpo_trainer.errors import classify

MONITOR = ("Task was killed due to the node running low on memory. Memory on the node "
           "was 15.2GB / 16GB (0.95), which exceeds the memory usage threshold of 0.95.")


def test_ray_oom_error_is_exit_4_ray_oom() -> None:
    c = classify(rex.OutOfMemoryError(MONITOR))
    assert (c.code, c.reason) == (ExitCode.HOST_OOM, FailureReason.RAY_OOM)


def test_actor_killed_by_the_memory_monitor_is_ray_oom_not_node_lost() -> None:
    c = classify(rex.RayActorError(error_msg=f"The actor died unexpectedly. {MONITOR}"))
    assert (c.code, c.reason) == (ExitCode.HOST_OOM, FailureReason.RAY_OOM)


def test_otherwise_lost_actor_is_exit_5() -> None:
    c = classify(rex.RayActorError(error_msg="The actor died because its node died."))
    assert (c.code, c.reason) == (ExitCode.WORKER_LOST, FailureReason.NODE_LOST)
