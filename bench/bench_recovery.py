"""Recovery latency: from an OOM kill of the head to the next attempt's RayCluster.

Measured: N injected failures (kwok chaos: OOMKilled, exit 137) of GRPOJob heads; per
failure, the time from a client watch seeing the head terminated to the watch seeing the
next attempt's RayCluster created, minus the configured backoff (1 s). Baseline in the
same run: KubeRay's own reaction to the same kill of a plain RayCluster's head, from the
head seen terminated to its replacement head pod created (KubeRay recreates the pod and
nothing more: no classification, no safer setting, no new cluster).

    .venv/bin/python bench/bench_recovery.py [--failures 50] [--jobs 10]
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from bench_operator import pct  # bench/ is the script's directory
from kubernetes import client, config, watch

from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed, running_testbed
from grpo_testbed.nodes import bulk_cpu_nodes
from grpo_testbed.operator_process import OperatorProcess
from grpo_testbed.processes import wait_until

REPO = Path(__file__).resolve().parents[1]
BACKOFF_S = 1.0


class Seen:
    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.lock = threading.Lock()

    def mark(self, key: str) -> None:
        with self.lock:
            self.at.setdefault(key, time.monotonic())

    def wait(self, key: str, timeout: float = 180) -> float:
        wait_until(key, lambda: key in self.at, timeout, interval_s=0.05)
        return self.at[key]


def watch_forever(list_fn: Any, args: tuple[Any, ...], on: Any, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            for ev in watch.Watch().stream(list_fn, *args, timeout_seconds=10):
                on(ev["type"], ev["object"])
                if stop.is_set():
                    return
        except Exception as exc:
            logging.warning("watch restarted after %r", exc)


def terminated(pod: Any) -> bool:
    return any(cs.state and cs.state.terminated for cs in pod.status.container_statuses or [])


def start_watches(ns: str, seen: Seen, stop: threading.Event) -> None:
    core, custom = client.CoreV1Api(), client.CustomObjectsApi()

    def on_pod(t: str, pod: Any) -> None:
        if (pod.metadata.labels or {}).get("ray.io/node-type") != "head":
            return
        seen.mark(f"pod-created/{pod.metadata.name}")
        if terminated(pod):
            seen.mark(f"head-ended/{pod.metadata.name}")

    def on_rc(t: str, rc: dict[str, Any]) -> None:
        seen.mark(f"rc/{rc['metadata']['name']}")

    for fn, args, on in ((core.list_namespaced_pod, (ns,), on_pod),
                         (custom.list_namespaced_custom_object, ("ray.io", "v1", ns,
                                                                  "rayclusters"), on_rc)):
        threading.Thread(target=watch_forever, args=(fn, args, on, stop), daemon=True).start()


def live_head(ns: str, selector: str) -> str | None:
    pods = client.CoreV1Api().list_namespaced_pod(ns, label_selector=selector).items
    for p in pods:
        if (p.status.phase == "Running" and not p.metadata.deletion_timestamp
                and not terminated(p)):
            return str(p.metadata.name)
    return None


def in_parallel(fn: Any, n: int) -> None:
    threads = [threading.Thread(target=fn, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def oom_kill(tb: Testbed, ns: str, pod: str) -> None:
    tb.kubectl("label", "pod", pod, "-n", ns, "grpo.dev/chaos=terminate")


def grpojob_failures(tb: Testbed, jobs: int, per_job: int) -> list[float]:
    ns = "op-recovery"
    tb.kubectl("create", "namespace", ns)
    seen, stop = Seen(), threading.Event()
    start_watches(ns, seen, stop)
    doc = example_job()
    # remediate: false, so the tiny CPU job's short HostOOM ladder does not end the
    # series early; the path measured (classify, record, backoff, new attempt) is the same.
    doc["spec"]["backoffLimit"] = per_job + 1
    doc["spec"]["recovery"] = {"remediate": False,
                               "backoff": {"initialSeconds": 1, "maxSeconds": 1}}
    for j in range(jobs):
        doc["metadata"] = {"name": f"r{j}", "namespace": ns}
        client.CustomObjectsApi().create_namespaced_custom_object(
            "grpo.dev", "v1alpha1", ns, "grpojobs", doc)
    out: list[float] = []
    lock = threading.Lock()

    def one_job(j: int) -> None:
        for k in range(per_job):
            sel = f"grpo.dev/job=r{j},grpo.dev/attempt={k},grpo.dev/role=head"
            wait_until(f"r{j} attempt {k} head",
                       lambda s=sel: live_head(ns, s) is not None, 180, interval_s=0.2)
            pod = live_head(ns, sel)
            assert pod
            oom_kill(tb, ns, pod)
            t_end = seen.wait(f"head-ended/{pod}")
            t_rc = seen.wait(f"rc/r{j}-a{k + 1}")
            with lock:
                out.append(t_rc - t_end - BACKOFF_S)

    in_parallel(one_job, jobs)
    stop.set()
    return out


def kuberay_failures(tb: Testbed, clusters: int, per_cluster: int) -> list[float]:
    ns = "kuberay-recovery"
    tb.kubectl("create", "namespace", ns)
    seen, stop = Seen(), threading.Event()
    start_watches(ns, seen, stop)
    for c in range(clusters):
        client.CustomObjectsApi().create_namespaced_custom_object("ray.io", "v1", ns,
                                                                  "rayclusters", {
            "apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": f"k{c}"},
            "spec": {"rayVersion": "2.60.0", "headGroupSpec": {"rayStartParams": {},
                     "template": {"spec": {"restartPolicy": "Never", "containers": [{
                         "name": "ray-head", "image": "rayproject/ray:2.60.0",
                         "resources": {"limits": {"cpu": "4", "memory": "13Gi"}}}]}}}}})
    out: list[float] = []
    lock = threading.Lock()

    def one(c: int) -> None:
        sel = f"ray.io/cluster=k{c},ray.io/node-type=head"
        for _ in range(per_cluster):
            wait_until(f"k{c} head", lambda: live_head(ns, sel) is not None, 180,
                       interval_s=0.2)
            pod = live_head(ns, sel)
            assert pod
            oom_kill(tb, ns, pod)
            t_end = seen.wait(f"head-ended/{pod}")

            def replaced(old: str = pod, since: float = t_end) -> bool:
                return any(k.startswith("pod-created/k") and k != f"pod-created/{old}"
                           and seen.at[k] > since and k.split("/")[1].startswith(f"k{c}-")
                           for k in list(seen.at))
            wait_until(f"k{c} replacement head", replaced, 180, interval_s=0.05)
            t_new = min(v for k, v in list(seen.at.items()) if k.startswith(
                f"pod-created/k{c}-") and v > t_end)
            with lock:
                out.append(t_new - t_end)

    in_parallel(one, clusters)
    stop.set()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--failures", type=int, default=50)
    ap.add_argument("--jobs", type=int, default=10)
    a = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    per_job = max(1, a.failures // a.jobs)
    with running_testbed() as tb:
        config.load_kube_config(str(tb.kubeconfig))
        tb.apply(bulk_cpu_nodes(4))
        tb.apply(yaml.safe_load((REPO / "crds" / "grpojob.yaml").read_text()), server_side=True)
        tb.kubectl("wait", "--for", "condition=established", "crd/grpojobs.grpo.dev")
        op = OperatorProcess(tb, Path(tempfile.mkdtemp(prefix="bench-rec-")),
                             webhook=False).start()
        try:
            ours = grpojob_failures(tb, a.jobs, per_job)
        finally:
            op.stop()
        base = kuberay_failures(tb, a.jobs, per_job)
    print(f"\n{len(ours)} OOM kills of GRPOJob heads, {len(base)} of plain RayCluster heads")
    print(f"{'seconds':24}{'ours: next attempt':>22}{'KubeRay: new head pod':>24}{'ratio':>8}")
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        print(f"{label:24}{pct(ours, q):>22.2f}{pct(base, q):>24.2f}"
              f"{pct(ours, q) / pct(base, q):>7.2f}x")
    print("ours = watch saw the head end -> watch saw the next attempt's RayCluster, "
          f"minus the {BACKOFF_S:.0f} s backoff; target p99 < 2 s")


if __name__ == "__main__":
    main()
