"""The tiny job with its rollouts apart (`spec.rollout.placement: disaggregated`) on the
testbed's real node, as a user runs it: the chart's operator, KubeRay, the trainer image.

The head pod runs Ray, the driver and both gloo ranks (labelled the training side); a
rollout pod of its own runs the transformers engine one step ahead (maxStaleness 1),
taking the weights from rank 0 after every update over gloo, between the two pods'
addresses. Mid-run the rollout pod is deleted at once (`kubectl delete pod --force`, as
a node lost or a spot VM reclaimed with no notice), which takes its whole Ray node with
it, object store and all: KubeRay creates it again, the trainer starts the engine again
on the new Ray node and pushes it the current weights, the samples lost with the node are
drawn again, and the attempt goes on to Succeed, no step lost, no restart.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from grpo_api.contract import RAY_SIDE_LABEL, ROLE_LABEL, Role
from grpo_testbed.chaos import live_pod
from grpo_testbed.tiny_job import (
    DISAGGREGATED_JOB,
    JOB_NS,
    TERMINAL,
    TinyJob,
    disaggregated_example,
    tiny_job_testbed,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(2400)]
STEPS = 40  # ~0.4 s a step here: the replacement (~10-20 s) falls mid-run
KILL_AT = 3  # the rollout pod is deleted once the status shows this step done


def _running_at(step: int) -> Any:
    def reached(job: dict[str, Any]) -> bool:
        st = job.get("status", {})
        if st.get("phase") in TERMINAL:
            raise AssertionError(f"the job ended before step {step}: {json.dumps(st)}")
        return int((st.get("progress") or {}).get("step") or 0) >= step
    return reached


@dataclass
class Apart:
    job: TinyJob
    deleted: str  # the rollout pod deleted mid-run


@pytest.fixture(scope="module")
def apart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Apart]:
    with tiny_job_testbed(tmp_path_factory.mktemp("e2e-apart"),
                          name=DISAGGREGATED_JOB) as tj:
        tj.install_chart()
        tj.build_assets()
        tj.apply_job(disaggregated_example(steps=STEPS))
        tj.watch(_running_at(KILL_AT), 1200, f"step {KILL_AT} of the job apart")
        deleted = live_pod(tj.tb.kubectl, JOB_NS, DISAGGREGATED_JOB, Role.ROLLOUT.value)
        tj.say(f"deleting the rollout pod {deleted}")
        # Forced: the kubelet kills the container 2 s after SIGTERM, as a node lost or a
        # spot VM reclaimed with no notice. (Deleted gracefully, Ray drains the node for
        # RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S, 30 s, the engine serving all the while.)
        tj.tb.kubectl("delete", "pod", deleted, "-n", JOB_NS, "--grace-period=0", "--force",
                      "--wait=false")
        tj.watch(lambda j: j.get("status", {}).get("phase") in TERMINAL, 1200,
                 "the job apart to finish")
        yield Apart(tj, deleted)


def _steps(log: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in log.splitlines() if x.startswith("{") and '"step"' in x]


def test_losing_the_rollout_pod_mid_run_ends_no_attempt_and_the_job_succeeds(
        apart: Apart) -> None:
    tj = apart.job
    st = tj.job()["status"]
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    assert st["restarts"] == 0 and len(st["attempts"]) == 1, st["attempts"]
    assert st["progress"]["step"] == STEPS
    # KubeRay created the rollout pod again: two of them, the first one deleted.
    rollout = tj.pods(0, Role.ROLLOUT)
    names = {p["metadata"]["name"] for p in rollout}
    assert apart.deleted in names and len(names) == 2, names
    # The trainer started the engine again on the new Ray node and went on: every step
    # once, in order, within the staleness bound, the restart counted.
    log = tj.head_log(0)
    steps = _steps(log)
    assert [m["step"] for m in steps] == list(range(1, STEPS + 1))
    assert sum(m["rollout/engine_restarts"] for m in steps) == 1  # per step: since the last
    assert all(m["offpolicy/version_gap_max"] <= 1 for m in steps)
    assert "rollout engine 0 (pid" in log and "died: starting it again" in log, log[-3000:]
    assert (tj.exported_dir() / "config.json").exists()


def test_the_two_sides_ran_as_pods_with_their_own_addresses_and_side_labels(
        apart: Apart) -> None:
    net = apart.job.tb.net
    assert net is not None
    pods = [p for p in apart.job.pods(0) if p.get("status", {}).get("podIP")]
    roles = {p["metadata"]["labels"][ROLE_LABEL] for p in pods}
    assert roles == {"head", "rollout"}, roles  # nodes 0: the head runs the ranks
    ips = {p["status"]["podIP"] for p in pods}
    assert len(ips) == len(pods)
    assert all(ipaddress.ip_address(ip) in ipaddress.ip_network(net.pod_cidr) for ip in ips)
    sides = {p["metadata"]["labels"][ROLE_LABEL]: p["metadata"]["labels"].get(RAY_SIDE_LABEL)
             for p in pods}
    assert sides == {"head": "train", "rollout": "rollout"}, sides
    for p in pods:
        limits = p["spec"]["containers"][0]["resources"]["limits"]
        assert limits["cpu"] == "1" and "nvidia.com/gpu" not in limits, limits


def test_the_plan_and_the_trainer_config_show_both_sides(apart: Apart) -> None:
    tj = apart.job
    st = tj.job()["status"]
    side = st["plan"]["rollout"]
    assert (side["gpu"], side["nodes"], side["enginesPerNode"], side["maxStaleness"]) == (
        "cpu", 1, 1, 1), side
    cm = json.loads(tj.tb.kubectl("get", "configmap", f"{DISAGGREGATED_JOB}-config-0",
                                     "-n", JOB_NS, "-o", "json").stdout)
    rollout = yaml.safe_load(cm["data"]["config.yaml"])["rollout"]
    assert rollout["placement"] == "disaggregated" and rollout["engine"] == "hf"
    assert rollout["disaggregated"] == {"nodes": 1, "engines_per_node": 1,
                                        "gpus_per_engine": 0, "cpus_per_engine": 1.0}
    wide = tj.tb.kubectl("get", "grpojobs", "-n", JOB_NS).stdout
    assert "disaggregated" in wide, wide
