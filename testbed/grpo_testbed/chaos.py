"""Ending a kwok pod's containers the way a kubelet reports it (config/kwok-chaos.yaml):
for tests of how the operator reads a pod's end. Only kwok's fake nodes act on it."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

Kubectl = Callable[..., Any]


def live_pod(kubectl: Kubectl, ns: str, job: str, role: str) -> str:
    """The name of the job's pod of this role that is not being deleted."""
    pods = json.loads(kubectl("get", "pods", "-n", ns, "-l",
                              f"grpo.dev/job={job},grpo.dev/role={role}", "-o", "json"
                              ).stdout)["items"]
    return str(next(p for p in pods if not p["metadata"].get("deletionTimestamp"))
               ["metadata"]["name"])


def end_pod(kubectl: Kubectl, ns: str, pod: str, exit_code: int = 137,
            reason: str = "OOMKilled", message: str = "") -> None:
    """Every container of ``pod`` ends with this exit code, reason and termination
    message (0 makes the pod Succeeded)."""
    kubectl("annotate", "pod", pod, "-n", ns, f"grpo.dev/chaos-exit-code={exit_code}",
            f"grpo.dev/chaos-reason={reason}", f"grpo.dev/chaos-message={message}",
            "--overwrite")
    kubectl("label", "pod", pod, "-n", ns, "grpo.dev/chaos=terminate")
