"""The tiny job as a multi-pod job on the testbed's real node: a CPU Ray head and a
worker pod, each in its own network namespace with its own address, both from the
product's trainer image, the worker finding the head through the head Service's DNS
name. The fault switch (in attempt 0's head pod spec, by the testbed's webhook) makes the
ranks leak host memory from step 2, so the WORKER pod runs out of memory: Ray's memory
monitor kills a rank at 95% of the pod's limit (RayOOM), or, when the leak outruns its
250 ms poll, the kernel kills the pod at the limit (the kubelet reports OOMKilled:
HostOOM). Either way the operator raises the pods' memory (the host ladder) and restarts
from the last checkpoint; attempt 1 finishes the job."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from grpo_api.contract import ATTEMPT_LABEL, JOB_LABEL, ROLE_LABEL, Env, Role
from grpo_testbed.faults import EnvInjection
from grpo_testbed.images import OPERATOR, TRAINER_CPU
from grpo_testbed.launcher import running_testbed
from grpo_testbed.node.runtime import NODE_NAME
from grpo_testbed.tiny_job import JOB, JOB_NS, TERMINAL, TinyJob, multipod_example

pytestmark = pytest.mark.e2e

LEAK_STEP = 2
LEAK_MIB = 1024  # per rank per step (the most the switch allows): 2 GiB a step
STEPS = 6
INTERVAL = 2


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TinyJob, list[Any]]]:
    """One run; yields the job and every pod set seen while it ran."""
    work = tmp_path_factory.mktemp("multipod")
    # The driver (head) reads the switch into the config it hands every rank.
    switch = EnvInjection({JOB_LABEL: JOB, ATTEMPT_LABEL: "0", ROLE_LABEL: Role.HEAD.value},
                          {Env.FAULT_INJECT.value: f"leak_host:{LEAK_MIB}@step={LEAK_STEP}"})
    with running_testbed(real_node=True, node_images=(OPERATOR.tag, TRAINER_CPU.tag),
                         injections=(switch,)) as tb:
        tj = TinyJob(tb, work)
        try:
            tj.install_chart()
            tj.start_operator()
            tj.build_assets()
            manifest = work / "grpojob-multipod.yaml"
            manifest.write_text(yaml.safe_dump(multipod_example(STEPS, INTERVAL)))
            tb.kubectl("apply", "-n", JOB_NS, "-f", str(manifest))
            seen: list[Any] = []

            def done(job: dict[str, Any]) -> bool:
                pods = json.loads(tb.kubectl("get", "pods", "-n", JOB_NS, "-l",
                                             f"{JOB_LABEL}={JOB}", "-o", "json").stdout)
                seen.append(pods["items"])
                return job.get("status", {}).get("phase") in TERMINAL

            tj.watch(done, 1200, "the multi-pod job to finish")
            yield tj, seen
        finally:
            tj.teardown()


def test_the_job_succeeds_after_a_real_oom_kill_of_its_worker_pod(
        run: tuple[TinyJob, list[Any]]) -> None:
    tj, seen = run
    st = tj.job()["status"]
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    first, second = st["attempts"]
    assert first["outcome"] in ("HostOOM", "RayOOM"), first
    assert first["remediation"], "the operator applied no step of the host-memory ladder"
    assert second["outcome"] == "Succeeded" and st["restarts"] == 1
    # A kernel kill is the worker pod's (kubectl get pods showed OOMKilled); the head's
    # memory never grew.
    killed = {p["metadata"]["labels"][ROLE_LABEL] for snapshot in seen for p in snapshot
              for c in p.get("status", {}).get("containerStatuses", [])
              for state in (c.get("state", {}), c.get("lastState", {}))
              if (state.get("terminated") or {}).get("reason") == "OOMKilled"}
    assert killed == ({"worker"} if first["outcome"] == "HostOOM" else set()), (killed, first)
    resumed = first["lastCheckpointStep"]
    assert resumed is not None and resumed % INTERVAL == 0 and resumed < STEPS, first
    assert f"resumed from checkpoint step {resumed}" in tj.head_log(1)


def test_head_and_worker_ran_as_pods_with_their_own_addresses(
        run: tuple[TinyJob, list[Any]]) -> None:
    tj, seen = run
    assert tj.tb.net is not None
    pods = {p["metadata"]["name"]: p for snapshot in seen for p in snapshot
            if p.get("status", {}).get("podIP")}
    roles = {p["metadata"]["labels"][ROLE_LABEL] for p in pods.values()}
    assert roles == {"head", "worker"}, sorted(pods)
    for attempt in (0, 1):
        mine = [p for n, p in pods.items() if f"{JOB}-a{attempt}-" in n]
        ips = {p["status"]["podIP"] for p in mine}
        assert len(mine) == len(ips) == 2, sorted(n for n in pods if f"-a{attempt}-" in n)
        net = ipaddress.ip_network(tj.tb.net.pod_cidr)
        assert all(ipaddress.ip_address(ip) in net for ip in ips)
        assert all(p["spec"]["nodeName"] == NODE_NAME for p in mine)
        assert all(c["image"] == TRAINER_CPU.tag for p in mine for c in p["spec"]["containers"])


def test_the_checkpoints_are_on_the_claim_both_pods_mount(
        run: tuple[TinyJob, list[Any]]) -> None:
    tj, _ = run
    steps = sorted(int(p.name.split("-")[-1]) for p in tj.checkpoint_dir().glob("step-*"))
    assert steps and steps[-1] == STEPS, steps


