"""The tiny job as a multi-pod job on the testbed's real node: a CPU Ray head and a
worker pod, each in its own network namespace with its own address, both from the
product's trainer image, the worker finding the head through the head Service's DNS
name. The fault switch (in attempt 0's head pod spec, by the testbed's webhook) makes the
ranks leak host memory from step 2, so the WORKER pod runs out of memory. A second switch
turns Ray's memory monitor off in attempt 0's worker pod (`RAY_memory_monitor_refresh_ms=0`,
which the raylet reads at `ray start`), so Ray kills nothing at 95% of the limit and the
kernel is what kills at the limit: the kubelet reports OOMKilled, the attempt is HostOOM,
the operator raises the pods' memory (the host ladder) and restarts from the last
checkpoint; attempt 1 finishes the job."""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator

import pytest

from grpo_api.contract import ATTEMPT_LABEL, JOB_LABEL, ROLE_LABEL, Env, Role
from grpo_testbed.faults import EnvInjection
from grpo_testbed.images import TRAINER_CPU
from grpo_testbed.node.runtime import NODE_NAME
from grpo_testbed.tiny_job import JOB, TERMINAL, TinyJob, multipod_example, tiny_job_testbed

pytestmark = pytest.mark.e2e

LEAK_STEP = 2
LEAK_MIB = 1024  # per rank per step (the most the switch allows): 2 GiB a step
STEPS = 6
INTERVAL = 2


# Only attempt 0's pods: the restarted attempt runs clean, with Ray's monitor on.
LEAK = EnvInjection({JOB_LABEL: JOB, ATTEMPT_LABEL: "0", ROLE_LABEL: Role.HEAD.value},
                    {Env.FAULT_INJECT.value: f"leak_host:{LEAK_MIB}@step={LEAK_STEP}"})
NO_RAY_MONITOR = EnvInjection(
    {JOB_LABEL: JOB, ATTEMPT_LABEL: "0", ROLE_LABEL: Role.WORKER.value},
    {"RAY_memory_monitor_refresh_ms": "0"})


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyJob]:
    """One run of the job to its end."""
    # The driver (head) reads the leak switch into the config it hands every rank.
    with tiny_job_testbed(tmp_path_factory.mktemp("multipod"), (LEAK, NO_RAY_MONITOR)) as tj:
        tj.install_chart()
        tj.build_assets()
        tj.apply_job(multipod_example(STEPS, INTERVAL))
        tj.watch(lambda j: j.get("status", {}).get("phase") in TERMINAL, 1200,
                 "the multi-pod job to finish")
        yield tj


def test_the_job_succeeds_after_the_kernel_oom_kills_its_worker_pod(run: TinyJob) -> None:
    st = run.job()["status"]
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    first, second = st["attempts"]
    ended = run.terminations(0)
    assert first["outcome"] == "HostOOM", (first, ended)
    assert first["remediation"], "the operator applied no step of the host-memory ladder"
    assert second["outcome"] == "Succeeded" and st["restarts"] == 1
    # The kernel killed the worker pod at its limit (kubectl get pods showed OOMKilled,
    # exit 137); the head's memory never grew.
    killed = {e.role for e in ended if (e.reason, e.exit_code) == ("OOMKilled", 137)}
    assert killed == {Role.WORKER}, ended
    resumed = first["lastCheckpointStep"]
    assert resumed is not None and resumed % INTERVAL == 0 and resumed < STEPS, first
    assert f"resumed from checkpoint step {resumed}" in run.head_log(1)


def test_head_and_worker_ran_as_pods_with_their_own_addresses(run: TinyJob) -> None:
    tj = run
    assert tj.tb.net is not None
    pods = {name: p for name, states in tj.pod_states.items() for p in states
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


def test_the_checkpoints_are_on_the_claim_both_pods_mount(run: TinyJob) -> None:
    steps = sorted(int(p.name.split("-")[-1]) for p in run.checkpoint_dir().glob("step-*"))
    assert steps and steps[-1] == STEPS, steps


