"""The testbed's local node agent with plain pods: what a kubelet would report.

Real processes, a real memory cgroup and a real kernel OOM kill; the API server sees
the statuses and the deletion. The tiny job (test_tiny_job.py) builds on all of it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_testbed.launcher import Testbed, running_testbed
from grpo_testbed.processes import wait_until


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    with running_testbed(local_node=True, with_kuberay=False) as t:
        yield t


@pytest.fixture
def ns(tb: Testbed) -> Iterator[str]:
    name = tb.namespace("node")
    yield name
    tb.kubectl("delete", "namespace", name, "--wait=false", check=False)


def pod(name: str, script: str, memory: str = "256Mi", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"restartPolicy": "Never", "containers": [{
            "name": "main", "image": "local", "command": ["/bin/bash", "-lc", "--"],
            "args": [script], "resources": {"limits": {"memory": memory, "cpu": "1"}},
            "terminationMessagePolicy": "FallbackToLogsOnError", **extra}]},
    }


def ended(tb: Testbed, ns: str, name: str, timeout_s: float = 60) -> dict[str, Any]:
    def get() -> dict[str, Any]:
        return dict(json.loads(tb.kubectl("get", "pod", name, "-n", ns, "-o", "json").stdout))

    wait_until(f"pod {name} ended", lambda: get()["status"].get("phase") in
               ("Succeeded", "Failed"), timeout_s)
    return get()


def test_pod_runs_with_env_configmap_and_token_and_reports_its_message(
        tb: Testbed, ns: str) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"},
          "data": {"config.yaml": "steps: 3\n"}}
    script = ("test \"$(cat /etc/cfg/config.yaml)\" = 'steps: 3' && "
              "test -s /var/run/secrets/kubernetes.io/serviceaccount/token && "
              "python -c 'import grpo_trainer' && "
              "echo \"$POD_NS $APP_LABEL\" > /dev/termination-log && exit 3")
    p = pod("ok", script, env=[
        {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "APP_LABEL", "valueFrom": {"fieldRef": {
            "fieldPath": "metadata.labels['app']"}}}],
        volumeMounts=[{"name": "cfg", "mountPath": "/etc/cfg"}])
    p["spec"]["volumes"] = [{"name": "cfg", "configMap": {"name": "cfg"}}]
    tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all([cm, p]))
    got = ended(tb, ns, "ok")
    assert got["spec"]["nodeName"] == "local-0"
    term = got["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (3, "Error"), term
    assert term["message"].strip() == f"{ns} ok"


def test_exceeding_the_memory_limit_is_a_real_oom_kill(tb: Testbed, ns: str) -> None:
    grow = "python -c 'b = []\nwhile True: b.append(b\"x\" * (16 << 20))'"
    tb.apply({**pod("hog", grow, memory="160Mi"), "metadata": {"name": "hog", "namespace": ns}})
    term = ended(tb, ns, "hog")["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (137, "OOMKilled"), term


def test_deleting_a_pod_kills_every_process_it_started(tb: Testbed, ns: str) -> None:
    marker = f"grpo-daemon-{os.urandom(4).hex()}"
    # A daemon in its own session, as `ray start` leaves its GCS and raylet behind.
    script = f"setsid bash -c 'exec -a {marker} sleep 600' & sleep 600"
    tb.apply({**pod("daemon", script), "metadata": {"name": "daemon", "namespace": ns}})

    def daemons() -> list[str]:
        return [p for p in os.listdir("/proc") if p.isdigit() and marker.encode() in
                _cmdline(Path("/proc") / p)]

    wait_until("the daemon running", lambda: bool(daemons()), 60)
    t0 = time.monotonic()
    tb.kubectl("delete", "pod", "daemon", "-n", ns, "--wait=true", "--timeout=60s")
    assert not daemons(), "a process of the deleted pod survived"
    assert time.monotonic() - t0 < 30


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""
