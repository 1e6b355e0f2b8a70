"""A disaggregated job with the real API server, the real KubeRay (v1.6.1) and the
operator: its RayCluster's rollout group is accepted (the Ray side labels in the groups'
top-level `labels`, which KubeRay passes to `ray start --labels`), its rollout pod lands
on the rollout GPU type's node, and the job shows its placement; a rollout pod deleted
mid-run is made again and the attempt goes on to Succeeded."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from grpo_api.contract import RAY_SIDE_LABEL, ROLE_LABEL
from grpo_testbed.chaos import end_pod, live_pod
from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed
from grpo_testbed.operator_process import OperatorProcess
from grpo_testbed.processes import wait_until

pytestmark = pytest.mark.cluster
GPU_EXAMPLE = "grpojob-qwen25vl-7b-h100.yaml"


def _status(tb: Testbed, ns: str) -> dict[str, Any]:
    out = tb.kubectl("get", "grpojob", "disagg", "-n", ns, "-o", "json").stdout
    return dict(json.loads(out).get("status") or {})


def _pods(tb: Testbed, ns: str, role: str) -> list[dict[str, Any]]:
    return list(json.loads(tb.kubectl("get", "pods", "-n", ns, "-l",
                                      f"grpo.dev/job=disagg,{ROLE_LABEL}={role}", "-o", "json"
                                      ).stdout)["items"])


def test_a_disaggregated_job_runs_its_rollout_group_on_the_rollout_gpu_type(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    # Training on an H100 node, the vLLM engines on an A100-40GB node (the fake nodes).
    job = example_job(GPU_EXAMPLE, "disagg", rollout={
        "placement": "disaggregated",
        "disaggregated": {"gpuType": "A100-40GB", "nodes": 1}})
    testbed.kubectl("apply", "-n", op_ns, "-f", "-", input=yaml.safe_dump(job))
    try:
        wait_until("disagg Running", lambda: _status(testbed, op_ns).get("phase") == "Running",
                   120)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {_status(testbed, op_ns)}\noperator log:\n"
                             f"{operator.log_tail()}") from None
    final = _status(testbed, op_ns)
    assert final["plan"]["placement"] == "disaggregated"
    assert final["plan"]["rollout"]["gpu"] == "A100-40GB"
    assert final["plan"]["rollout"]["enginesPerNode"] == 8
    pods = json.loads(testbed.kubectl("get", "pods", "-n", op_ns, "-l", "grpo.dev/job=disagg",
                                      "-o", "json").stdout)["items"]
    by_role = {p["metadata"]["labels"][ROLE_LABEL]: p for p in pods}
    assert set(by_role) == {"head", "worker", "rollout"}
    rollout, worker = by_role["rollout"], by_role["worker"]
    assert rollout["spec"]["nodeName"].startswith("a100-40gb-")
    assert worker["spec"]["nodeName"].startswith("h100-")
    assert rollout["metadata"]["labels"][RAY_SIDE_LABEL] == "rollout"
    assert worker["metadata"]["labels"][RAY_SIDE_LABEL] == "train"
    start = {e["name"]: e.get("value", "") for e in rollout["spec"]["containers"][0]["env"]}
    assert f"--labels={RAY_SIDE_LABEL}=rollout" in start["KUBERAY_GEN_RAY_START_CMD"]
    shown = testbed.kubectl("get", "gj", "disagg", "-n", op_ns).stdout
    assert "disaggregated" in shown.splitlines()[1]

    # A rollout pod lost mid-run: KubeRay makes another, the attempt goes on (the driver
    # restarts the engine there: tests/trainer), and the job can still succeed.
    lost = rollout["metadata"]["name"]
    testbed.kubectl("delete", "pod", lost, "-n", op_ns, "--wait=false")

    def replaced() -> bool:
        return any(p["metadata"]["name"] != lost and p["status"].get("phase") == "Running"
                   for p in _pods(testbed, op_ns, "rollout"))

    wait_until("a new rollout pod Running", replaced, 120)
    after = _status(testbed, op_ns)
    assert (after["phase"], len(after["attempts"]), after.get("restarts", 0)) == (
        "Running", 1, 0), after
    done = json.dumps({"reason": "Succeeded", "step": 3, "lastCheckpointStep": 3,
                       "detail": ""})
    end_pod(testbed.kubectl, op_ns, live_pod(testbed.kubectl, op_ns, "disagg", "head"), 0,
            "Completed", done)
    wait_until("disagg Succeeded", lambda: _status(testbed, op_ns).get("phase") == "Succeeded",
               60)
    assert [a["outcome"] for a in _status(testbed, op_ns)["attempts"]] == ["Succeeded"]
    testbed.kubectl("delete", "grpojob", "disagg", "-n", op_ns, "--wait=false")
    wait_until("disagg's pods gone", lambda: not json.loads(testbed.kubectl(
        "get", "pods", "-n", op_ns, "-l", "grpo.dev/job=disagg", "-o", "json").stdout)["items"],
        120)
