"""The operator as the chart deploys it, on the real node: every start reconciles, even
right after `helm install` created the CRD; and when its watch streams die, /healthz
fails, the kubelet restarts it, and the restarted operator reconciles (discovery.py,
watch_health.py; docs/troubleshooting.md, "The operator logs nothing")."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from grpo_testbed.examples import example_job
from grpo_testbed.images import OPERATOR, TRAINER_GPU
from grpo_testbed.launcher import Testbed
from grpo_testbed.processes import wait_until
from grpo_testbed.tiny_job import CHART

pytestmark = pytest.mark.e2e

RELEASE = "live"
REPOSITORY, TAG = OPERATOR.tag.rsplit(":", 1)
CHART_STARTS = 5  # the local process starts 12 times (tests/cluster/test_operator_start.py)
STALE_AFTER_S = 100  # the chart's minimum is 90: Kopf renews an idle watch every 70 s


def operator_pod(tb: Testbed, ns: str) -> dict[str, Any]:
    pods = json.loads(tb.kubectl("get", "pods", "-n", ns, "-o", "json").stdout)["items"]
    (pod,) = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return dict(pod)


def restarts(tb: Testbed, ns: str) -> int:
    statuses = operator_pod(tb, ns)["status"].get("containerStatuses") or [{}]
    return int(statuses[0].get("restartCount", 0))


def submit_and_wait(tb: Testbed, ns: str, name: str, timeout_s: float) -> None:
    doc = example_job("grpojob-qwen25vl-7b-h100.yaml", name)
    tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc))
    wait_until(f"job {name} reconciled (status.plan)", lambda: bool(json.loads(tb.kubectl(
        "get", "grpojob", name, "-n", ns, "-o", "json").stdout).get("status", {}).get("plan")),
        timeout_s)


def gone(tb: Testbed, *namespaces: str) -> None:
    """Delete and wait: a job left in a terminating namespace would be seen by the next
    module's cluster-wide operator."""
    tb.kubectl("delete", "namespace", *namespaces, "--wait=true", "--timeout=180s",
               check=False, timeout=240)


def install_args(ns: str, *values: str) -> list[str]:
    return ["-n", ns, "--set", f"image.repository={REPOSITORY}", "--set", f"image.tag={TAG}",
            # A full reference, as the chart requires: the GPU trainer's name; the
            # jobs here are only planned, their pods never start from it.
            "--set", f"trainerImage={TRAINER_GPU.tag}",
            "--set", "image.pullPolicy=Never", "--set", "leaderElection.enabled=false",
            "--set", "replicaCount=1",
            "--set", "readPublicHub=false",  # nothing leaves the testbed
            *(a for v in values for a in ("--set", v)), "--wait", "--timeout", "240s"]


def test_every_chart_install_reconciles_right_after_its_crd_is_created(
        real_tb: Testbed) -> None:
    """`helm install` applies the CRD, waits until it is Established, then starts the
    operator's pod, which meets a CRD that API discovery may not list yet. Each round
    starts from no CRD at all (and restores it at the end for the rest of the session)."""
    def crd_gone() -> None:
        real_tb.kubectl("delete", "crd", "grpojobs.grpo.dev", "--ignore-not-found",
                        "--wait=true", "--timeout=120s")

    crd_gone()
    try:
        for i in range(CHART_STARTS):
            ops = real_tb.namespace("grpo-start")
            real_tb.helm("install", f"start{i}", str(CHART), *install_args(ops))
            jobs = real_tb.namespace("start-jobs")
            try:
                submit_and_wait(real_tb, jobs, "seven", 90)
            finally:
                real_tb.kubectl("delete", "grpojob", "--all", "-n", jobs, "--wait=true",
                                "--timeout=60s", check=False)
                real_tb.helm("uninstall", f"start{i}", "-n", ops, "--wait", "--timeout",
                             "120s")
                gone(real_tb, jobs, ops)
                crd_gone()
    finally:
        real_tb.apply(yaml.safe_load((CHART / "crds" / "grpojob.yaml").read_text()),
                      server_side=True)
        real_tb.wait_established("GRPOJob", ("grpojobs.grpo.dev",))


@pytest.fixture
def release(real_tb: Testbed) -> Iterator[tuple[str, str]]:
    """The chart watching one namespace, webhook off (nothing else in the session is
    admitted through it), probes tightened so that the test waits minutes, not ten."""
    ops, jobs = real_tb.namespace("grpo-live"), real_tb.namespace("live-jobs")
    real_tb.helm("install", RELEASE, str(CHART), *install_args(
        ops, "webhook.enabled=false", f"watchNamespaces={{{jobs}}}",
        f"probes.liveness.watchStaleAfterSeconds={STALE_AFTER_S}",
        "probes.liveness.initialDelaySeconds=5", "probes.liveness.periodSeconds=5",
        "probes.liveness.failureThreshold=2"))
    yield ops, jobs
    real_tb.helm("uninstall", RELEASE, "-n", ops, "--wait", "--timeout", "120s", check=False)
    gone(real_tb, jobs, ops)


def test_an_operator_whose_watches_die_is_restarted_by_its_liveness_probe_and_reconciles(
        real_tb: Testbed, release: tuple[str, str]) -> None:
    ops, jobs = release
    submit_and_wait(real_tb, jobs, "before", 120)
    assert restarts(real_tb, ops) == 0
    net = real_tb.net
    assert net is not None
    pod_ip = operator_pod(real_tb, ops)["status"]["podIP"]
    # The partition: the node refuses whatever the operator's pod sends to the API server
    # (its watch streams reset, reconnects are refused); the kubelet's probes of the pod
    # do not cross the node's FORWARD chain and still arrive.
    rule = ["FORWARD", "-s", pod_ip, "-d", net.host_ip, "-p", "tcp", "--dport",
            str(real_tb.api_port), "-j", "REJECT", "--reject-with", "tcp-reset"]
    subprocess.run([*net.nsenter(), "iptables", "-I", *rule], check=True)
    t_cut = time.monotonic()
    try:
        wait_until("the kubelet restarting the operator (liveness probe failed)",
                   lambda: restarts(real_tb, ops) >= 1, STALE_AFTER_S + 150)
    finally:
        subprocess.run([*net.nsenter(), "iptables", "-D", *rule], check=False)
    restarted_after = time.monotonic() - t_cut
    # The restarted container's log: right after the restart the kubelet may still serve
    # an empty one (seen once under load), so it is read until it has lines, briefly.
    logs: list[str] = [""]

    def previous_log() -> bool:
        logs[0] = real_tb.kubectl("logs", "-n", ops, "deploy/live-grpo-operator",
                                  "--previous", check=False).stdout
        return bool(logs[0].strip())

    with contextlib.suppress(TimeoutError):  # the assertion below says what was read
        wait_until("the restarted container's log", previous_log, 30, interval_s=2.0)
    previous = logs[0]
    assert "/healthz: not watching" in previous, previous[-3000:]
    events = json.loads(real_tb.kubectl("get", "events", "-n", ops, "-o", "json").stdout)
    unhealthy = [e.get("message", "") for e in events["items"] if e.get("reason") == "Unhealthy"]
    assert any(m.startswith("Liveness probe failed") for m in unhealthy), events["items"]
    submit_and_wait(real_tb, jobs, "after", 180)
    print(f"watches cut -> container restarted in {restarted_after:.0f} s "
          f"(watchStaleAfterSeconds {STALE_AFTER_S}, probe every 5 s, 2 failures)")
