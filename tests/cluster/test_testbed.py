"""The testbed is a real cluster: scheduling, KubeRay, chaos, schema, RBAC, cleanup."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from grpo_api.catalog import GPU_CATALOG, GPU_PRODUCT_LABEL, GPU_RESOURCE
from grpo_api.job import quantity_gib
from grpo_testbed.launcher import Testbed
from grpo_testbed.processes import wait_until

H100 = GPU_CATALOG["H100-80GB"].product_label
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}


def gpu_pod(name: str, gpus: int, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "nodeSelector": {GPU_PRODUCT_LABEL: H100},
            "tolerations": [GPU_TOLERATION],
            "containers": [{"name": "main", "image": "busybox:1.36",
                            "resources": {"limits": {GPU_RESOURCE: str(gpus)}}}],
        },
    }


def get(tb: Testbed, kind: str, name: str, ns: str) -> dict[str, Any]:
    return json.loads(tb.kubectl("get", kind, name, "-n", ns, "-o", "json").stdout)


def pod_phase(tb: Testbed, name: str, ns: str) -> str:
    return str(get(tb, "pod", name, ns).get("status", {}).get("phase", ""))


def test_fake_gpu_nodes_look_real(testbed: Testbed) -> None:
    nodes = json.loads(testbed.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    by_product: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        by_product.setdefault(n["metadata"]["labels"].get(GPU_PRODUCT_LABEL, "cpu"), []).append(n)
    h100s, a100s = by_product[H100], by_product[GPU_CATALOG["A100-40GB"].product_label]
    assert len(h100s) >= 2 and len(a100s) >= 2 and by_product["cpu"]
    assert all(n["status"]["allocatable"][GPU_RESOURCE] == "8" for n in h100s + a100s)
    assert {quantity_gib(n["status"]["capacity"]["memory"]) for n in h100s} == {2048}
    assert {quantity_gib(n["status"]["capacity"]["memory"]) for n in a100s} == {760}
    version = json.loads(testbed.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"].startswith("v1.36.")


def test_gpu_pod_schedules_onto_h100_and_runs_and_too_many_gpus_stay_pending(
        testbed: Testbed, ns: str) -> None:
    testbed.apply([{**p, "metadata": {**p["metadata"], "namespace": ns}}
                   for p in (gpu_pod("fits", 8), gpu_pod("too-big", 9))])
    wait_until("pod fits Running", lambda: pod_phase(testbed, "fits", ns) == "Running", 60)
    node = get(testbed, "pod", "fits", ns)["spec"]["nodeName"]
    node_labels = get(testbed, "node", node, "")["metadata"]["labels"]
    assert node_labels[GPU_PRODUCT_LABEL] == H100

    def unschedulable() -> bool:
        conds = get(testbed, "pod", "too-big", ns)["status"].get("conditions", [])
        return any(c["type"] == "PodScheduled" and c.get("reason") == "Unschedulable"
                   for c in conds)

    wait_until("pod too-big Unschedulable", unschedulable, 60)
    assert pod_phase(testbed, "too-big", ns) == "Pending"
    assert "nodeName" not in get(testbed, "pod", "too-big", ns)["spec"]


RAYCLUSTER = """
apiVersion: ray.io/v1
kind: RayCluster
metadata:
  name: rc
spec:
  rayVersion: "2.60.0"
  headGroupSpec:
    rayStartParams: {}
    template:
      spec:
        containers:
        - name: ray-head
          image: rayproject/ray:2.60.0
          resources:
            limits: {cpu: "2", memory: 8Gi}
  workerGroupSpecs:
  - groupName: gpu
    replicas: 2
    minReplicas: 0
    maxReplicas: 2
    rayStartParams: {}
    template:
      spec:
        nodeSelector:
          nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3
        tolerations:
        - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}
        containers:
        - name: ray-worker
          image: rayproject/ray:2.60.0
          resources:
            limits: {cpu: "8", memory: 64Gi, nvidia.com/gpu: "8"}
"""


def test_raycluster_gets_head_and_worker_pods_running_via_real_kuberay(
        testbed: Testbed, ns: str) -> None:
    testbed.kubectl("apply", "-n", ns, "-f", "-", input=RAYCLUSTER)

    def pods_running() -> bool:
        pods = json.loads(testbed.kubectl("get", "pods", "-n", ns, "-l",
                                          "ray.io/cluster=rc", "-o", "json").stdout)["items"]
        types = sorted(p["metadata"]["labels"].get("ray.io/node-type", "") for p in pods
                       if p["status"].get("phase") == "Running")
        return types == ["head", "worker", "worker"]

    wait_until("RayCluster head + 2 workers Running", pods_running, 120)
    workers = json.loads(testbed.kubectl("get", "pods", "-n", ns, "-l",
                                         "ray.io/node-type=worker", "-o", "json").stdout)["items"]
    assert {w["spec"]["nodeName"] for w in workers} <= {"h100-0", "h100-1"}


def test_chaos_stage_oom_kills_a_running_pod(testbed: Testbed, ns: str) -> None:
    pod = gpu_pod("victim", 1)
    pod["metadata"]["namespace"] = ns
    testbed.apply(pod)
    wait_until("victim Running", lambda: pod_phase(testbed, "victim", ns) == "Running", 60)
    testbed.kubectl("label", "pod", "victim", "-n", ns, "grpo.dev/chaos=terminate")
    wait_until("victim Failed", lambda: pod_phase(testbed, "victim", ns) == "Failed", 60)
    term = get(testbed, "pod", "victim", ns)["status"]["containerStatuses"][0]["state"]
    assert term["terminated"]["reason"] == "OOMKilled"
    assert term["terminated"]["exitCode"] == 137


def test_chaos_stage_carries_a_json_termination_message(testbed: Testbed, ns: str) -> None:
    pod = gpu_pod("trainer", 1)
    pod["metadata"]["namespace"] = ns
    message = json.dumps({"reason": "CudaOOM", "step": 812, "lastCheckpointStep": 800})
    pod["metadata"]["annotations"] = {"grpo.dev/chaos-reason": "Error",
                                      "grpo.dev/chaos-exit-code": "3",
                                      "grpo.dev/chaos-message": message}
    testbed.apply(pod)
    wait_until("trainer Running", lambda: pod_phase(testbed, "trainer", ns) == "Running", 60)
    testbed.kubectl("label", "pod", "trainer", "-n", ns, "grpo.dev/chaos=terminate")
    wait_until("trainer Failed", lambda: pod_phase(testbed, "trainer", ns) == "Failed", 60)
    term = get(testbed, "pod", "trainer", ns)["status"]["containerStatuses"][0]["state"]
    assert term["terminated"]["exitCode"] == 3
    assert json.loads(term["terminated"]["message"])["step"] == 812


def test_api_server_rejects_an_object_that_breaks_a_crd_schema(testbed: Testbed, ns: str) -> None:
    bad = RAYCLUSTER.replace("replicas: 2\n", "replicas: two\n", 1)
    proc = testbed.kubectl("apply", "-n", ns, "-f", "-", input=bad, check=False)
    assert proc.returncode != 0
    assert "replicas" in proc.stderr


def test_service_account_without_rolebinding_is_denied(testbed: Testbed, ns: str) -> None:
    testbed.kubectl("create", "serviceaccount", "nobody", "-n", ns)
    who = f"system:serviceaccount:{ns}:nobody"
    denied = testbed.kubectl("auth", "can-i", "list", "pods", "-n", ns, "--as", who,
                             check=False)
    assert denied.stdout.strip() == "no"
    testbed.kubectl("create", "role", "pod-reader", "-n", ns, "--verb=list",
                    "--resource=pods")
    testbed.kubectl("create", "rolebinding", "nobody-reads", "-n", ns, "--role=pod-reader",
                    f"--serviceaccount={ns}:nobody")
    allowed = testbed.kubectl("auth", "can-i", "list", "pods", "-n", ns, "--as", who,
                              check=False)
    assert allowed.stdout.strip() == "yes"


def _descendants(pid: int) -> set[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True,
                         check=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        p, pp = map(int, line.split())
        children.setdefault(pp, []).append(p)
    found, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.add(c)
            todo.append(c)
    return found


def _alive(pids: set[int]) -> set[int]:
    alive = set()
    for p in pids:
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        if stat.split(")", 1)[1].split()[0] != "Z":
            alive.add(p)
    return alive


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_launcher_leaves_no_process_behind(sig: signal.Signals, tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_testbed", "up", "--no-kuberay", "--dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "GRPO_TESTBED_KEEP": "1"},
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith("export KUBECONFIG="), first
        children = _descendants(proc.pid)
        assert len(children) >= 5  # etcd, apiserver, kcm, scheduler, kwok
        proc.send_signal(sig)
        proc.wait(60)
        deadline = time.monotonic() + 30
        while _alive(children) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not _alive(children), f"left behind after {sig.name}: {_alive(children)}"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_testbed_serves_s3_on_the_api_servers_address(
        testbed: Testbed, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every full testbed runs its S3 server (versitygw) where the API server listens: a
    client with its keys writes, lists and reads back; without them it is refused."""
    from grpo_api.trainer_config import ObjectStoreConfig
    from grpo_trainer.object_store import ObjectStore, StoreRefused

    s3 = testbed.s3
    assert s3 is not None and s3.host == testbed.api_host
    bucket = s3.make_bucket("testbed-check")
    cfg = ObjectStoreConfig(uri=f"s3://{bucket}/a", endpoint=s3.endpoint, path_style=True,
                            keys_secret="testbed-keys")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3.secret_key)
    store = ObjectStore(cfg)
    store.put_bytes("x/y.bin", b"hello")
    assert store.sizes() == {"x/y.bin": 5} and store.get_bytes("x/y.bin") == b"hello"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    with pytest.raises(StoreRefused, match="testbed-keys"):
        ObjectStore(cfg).sizes()
