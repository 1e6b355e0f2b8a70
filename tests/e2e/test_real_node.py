"""The testbed's real node: a real kubelet on containerd 2 + runc + CNI, in a network
namespace of its own, running pods from the product's images.

What KubeRay and the operator rely on, each checked as a user of a cluster would see it:
several pods at once, each with its own address (two of them on the same fixed port),
reaching each other by IP and through a Service's cluster DNS name (CoreDNS), reaching the
API server through the `kubernetes` Service (kube-proxy), `kubectl logs` and `exec`, the
image's own root filesystem, a real memory-limit kill (OOMKilled, exit 137), deletion that
kills the whole container, and allocatable resources the scheduler honours.
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_testbed.images import OPERATOR
from grpo_testbed.launcher import Testbed
from grpo_testbed.node.runtime import NODE_NAME
from grpo_testbed.processes import wait_until

pytestmark = pytest.mark.e2e

IMAGE = OPERATOR.tag  # has Python and the kubernetes client; not this checkout's venv
PY = "/opt/venv/bin/python"


@pytest.fixture
def tb(real_tb: Testbed) -> Testbed:
    return real_tb


@pytest.fixture
def ns(tb: Testbed) -> Iterator[str]:
    name = tb.namespace("node")
    yield name
    tb.kubectl("delete", "namespace", name, "--wait=false", check=False)


def pod(name: str, script: str, memory: str = "128Mi", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {"restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                 "containers": [{
                     "name": "main", "image": IMAGE, "imagePullPolicy": "Never",
                     "command": ["/bin/sh", "-c", script],
                     "resources": {"limits": {"memory": memory, "cpu": "250m"}},
                     "terminationMessagePolicy": "FallbackToLogsOnError", **extra}]},
    }


def get(tb: Testbed, ns: str, name: str) -> dict[str, Any]:
    return dict(json.loads(tb.kubectl("get", "pod", name, "-n", ns, "-o", "json").stdout))


def ended(tb: Testbed, ns: str, name: str, timeout_s: float = 90) -> dict[str, Any]:
    wait_until(f"pod {name} ended", lambda: get(tb, ns, name)["status"].get("phase") in
               ("Succeeded", "Failed"), timeout_s)
    return get(tb, ns, name)


def running(tb: Testbed, ns: str, name: str, timeout_s: float = 90) -> dict[str, Any]:
    wait_until(f"pod {name} Running", lambda: get(tb, ns, name)["status"].get("phase") ==
               "Running", timeout_s)
    return get(tb, ns, name)


SERVE = f"exec {PY} -m http.server 8080 --bind 0.0.0.0"


def test_pods_have_their_own_addresses_and_reach_each_other_the_dns_and_the_api(
        tb: Testbed, ns: str) -> None:
    assert tb.net is not None
    role = [
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "read-pods"},
         "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": "read-pods"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": "read-pods"},
         "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}]},
    ]
    # Two servers on the same fixed port (as KubeRay's head and workers use 8080, 52365):
    # one address each, so no collision. A headless Service (KubeRay's head Service) and a
    # ClusterIP one in front of them.
    services = [
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
         "spec": {"selector": {"app": "a"}, "ports": [{"port": 8080}], **spec}}
        for name, spec in (("a-headless", {"clusterIP": "None"}), ("a-svc", {}))
    ]
    docs = [*role, *services, pod("a", SERVE), pod("b", SERVE)]
    tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all(docs))
    a, b = running(tb, ns, "a"), running(tb, ns, "b")
    ips = {a["status"]["podIP"], b["status"]["podIP"]}
    assert len(ips) == 2
    assert all(ipaddress.ip_address(i) in ipaddress.ip_network(tb.net.pod_cidr) for i in ips)
    assert a["spec"]["nodeName"] == b["spec"]["nodeName"] == NODE_NAME

    # A Service works once kube-proxy has written its rules, a moment after the pods are
    # Running (seconds under load; until then the node answers "Network is unreachable"):
    # fetch retries for a minute, as a client of a new Service would.
    check = f"""
import json, ssl, time, urllib.error, urllib.request
def fetch(url):
    deadline = time.monotonic() + 60
    while True:
        try:
            return urllib.request.urlopen(url, timeout=10).status
        except urllib.error.URLError as err:
            if time.monotonic() > deadline:
                raise
            print("retrying", url, err, flush=True)
            time.sleep(1)
assert fetch("http://{b['status']['podIP']}:8080/") == 200          # by pod IP
assert fetch("http://a-headless.{ns}.svc.cluster.local:8080/") == 200  # DNS, headless
assert fetch("http://a-svc:8080/") == 200                              # search path, ClusterIP
from kubernetes import client, config
config.load_incluster_config()                                         # the kubernetes Service
me = client.CoreV1Api().read_namespaced_pod("c", "{ns}")
print("API", me.status.pod_ip)
try:                                                                   # the testbed S3
    urllib.request.urlopen("{tb.s3.endpoint if tb.s3 else ''}/", timeout=10)
except urllib.error.HTTPError as err:                                  # unsigned: refused
    print("S3", err.code)
"""
    tb.kubectl("apply", "-n", ns, "-f", "-",
               input=yaml.safe_dump(pod("c", f"exec {PY} -c '{check}'")))
    c = ended(tb, ns, "c", timeout_s=150)
    logs = tb.kubectl("logs", "c", "-n", ns).stdout
    assert c["status"]["phase"] == "Succeeded", logs
    assert f"API {c['status']['podIP']}" in logs
    assert "S3 403" in logs  # pods reach the testbed's S3 server (checkpoint.store's path)


def test_kubectl_logs_and_exec_reach_the_node(tb: Testbed, ns: str) -> None:
    tb.apply({**pod("talk", "echo hello from the pod; exec sleep 600"),
              "metadata": {"name": "talk", "namespace": ns}})
    running(tb, ns, "talk")
    wait_until("kubectl logs", lambda: "hello from the pod" in tb.kubectl(
        "logs", "talk", "-n", ns, check=False).stdout, 30)
    out = tb.kubectl("exec", "talk", "-n", ns, "--", "cat", "/etc/hostname").stdout
    assert out.strip() == "talk"


def test_the_container_runs_from_its_image_with_the_pods_settings(
        tb: Testbed, ns: str) -> None:
    here = Path(__file__).resolve().parents[2]  # this checkout: must not be visible
    script = (f"test ! -e {here}/pyproject.toml && test -x {PY} && "
              f"{PY} -c 'import grpo_operator' && "
              "echo \"$(id -u) $(pwd) $GREETING\" > /dev/termination-log")
    p = pod("img", script, env=[{"name": "GREETING", "value": "hi"}],
            workingDir="/tmp", securityContext={"runAsUser": 10001, "runAsNonRoot": True})
    tb.apply({**p, "metadata": {"name": "img", "namespace": ns}})
    got = ended(tb, ns, "img")
    term = got["status"]["containerStatuses"][0]["state"]["terminated"]
    assert term["exitCode"] == 0, term
    assert term["message"].split() == ["10001", "/tmp", "hi"]


def test_the_fault_switch_is_in_the_pod_spec_of_matching_pods_only(
        tb: Testbed, ns: str) -> None:
    """The testbed's mutating webhook adds the switch's env as the pod is created; the
    real kubelet runs what the API server stored."""
    show = "echo \"fault=${GRPO_FAULT_INJECT:-none}\" > /dev/termination-log"
    on = pod("on", show)
    on["metadata"]["labels"]["testbed.grpo.dev/switch"] = "on"
    tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump_all([on, pod("off", show)]))
    env = get(tb, ns, "on")["spec"]["containers"][0]["env"]
    assert {"name": "GRPO_FAULT_INJECT", "value": "host_oom@step=3"} in env
    assert "env" not in get(tb, ns, "off")["spec"]["containers"][0]
    said = {name: ended(tb, ns, name)["status"]["containerStatuses"][0]["state"]["terminated"]
            ["message"].strip() for name in ("on", "off")}
    assert said == {"on": "fault=host_oom@step=3", "off": "fault=none"}


def test_exceeding_the_memory_limit_is_a_real_oom_kill(tb: Testbed, ns: str) -> None:
    grow = f"exec {PY} -c 'b = []\nwhile True: b.append(bytearray(16 << 20))'"
    tb.apply({**pod("hog", grow, memory="96Mi"), "metadata": {"name": "hog", "namespace": ns}})
    term = ended(tb, ns, "hog")["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (137, "OOMKilled"), term


def test_deleting_a_pod_kills_every_process_in_it(tb: Testbed, ns: str) -> None:
    marker = f"grpo-daemon-{os.urandom(4).hex()}"
    # A process in its own session, as `ray start` leaves its GCS and raylet behind.
    script = f"setsid bash -c 'exec -a {marker} sleep 600' & exec sleep 600"
    tb.apply({**pod("daemon", script), "metadata": {"name": "daemon", "namespace": ns}})

    def daemons() -> list[str]:
        return [p for p in os.listdir("/proc") if p.isdigit() and marker.encode() in
                _cmdline(Path("/proc") / p)]

    wait_until("the daemon running", lambda: bool(daemons()), 60)
    tb.kubectl("delete", "pod", "daemon", "-n", ns, "--wait=true", "--timeout=60s")
    wait_until("every process of the pod gone", lambda: not daemons(), 10)


def test_the_scheduler_fits_pods_to_the_nodes_allocatable_memory(
        tb: Testbed, ns: str) -> None:
    node = json.loads(tb.kubectl("get", "node", NODE_NAME, "-o", "json").stdout)["status"]
    alloc_mib = _mib(node["allocatable"]["memory"])
    assert alloc_mib < _mib(node["capacity"]["memory"])  # the system reserve is kept back
    big = pod("big", "exec sleep 600", memory=f"{alloc_mib + 64}Mi")
    tb.apply({**big, "metadata": {"name": "big", "namespace": ns}})

    def refused() -> bool:
        events = tb.kubectl("get", "events", "-n", ns, "--field-selector",
                            "involvedObject.name=big", "-o", "json").stdout
        return any(e["reason"] == "FailedScheduling" and "Insufficient memory" in e["message"]
                   for e in json.loads(events)["items"])

    wait_until("FailedScheduling: Insufficient memory", refused, 60)
    assert get(tb, ns, "big")["status"]["phase"] == "Pending"


def _mib(quantity: str) -> int:
    units = {"Ki": 1 / 1024, "Mi": 1, "Gi": 1024}
    for suffix, f in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity[: -len(suffix)]) * f)
    return int(quantity) // (1 << 20)


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""




def test_a_container_whose_process_is_oom_killed_ends_whole_as_on_cgroup_v2(
        tb: Testbed, ns: str) -> None:
    """A child that raises its oom_score_adj (as Ray does for its workers) and grows is the
    kernel's victim at the limit; the container's first process would live on under
    cgroup v1. The node ends the container whole, as memory.oom.group does on cgroup v2,
    so the pod says OOMKilled, exit 137, like a worker pod whose rank ran out of memory."""
    child = (f"{PY} -c \"open('/proc/self/oom_score_adj', 'w').write('1000')\nb = []\n"
             "while True: b.append(bytearray(16 << 20))\"")
    tb.apply({**pod("ray-like", f"{child}; echo the first process lived on; sleep 600",
                    memory="128Mi"), "metadata": {"name": "ray-like", "namespace": ns}})
    term = ended(tb, ns, "ray-like")["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (137, "OOMKilled"), term
