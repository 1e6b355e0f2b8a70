"""200 GRPOJobs at once through the operator vs 200 RayJobs through KubeRay alone.

Per object, from the moment a watch sees it created: time until its RayCluster exists,
and until it is Running (GRPOJob phase Running; RayJob jobDeploymentStatus Running).
Also the operator's peak RSS and CPU time. Both runs share one testbed, one after the
other, on enough extra fake CPU nodes that scheduling never waits for capacity.

    .venv/bin/python bench/bench_operator.py [--jobs 200]
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import logging
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, watch

from grpo_api.contract import Phase
from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed, running_testbed
from grpo_testbed.nodes import bulk_cpu_nodes
from grpo_testbed.operator_process import OperatorProcess
from grpo_testbed.processes import wait_until

REPO = Path(__file__).resolve().parents[1]
NS = "op-bench"
BASE_NS = "rayjob-bench"


class Stopwatch:
    """Per object name: its creation as the API server recorded it, and the first time a
    client watch saw its RayCluster and its Running state (wall clock, one machine)."""

    def __init__(self) -> None:
        self.created: dict[str, float] = {}
        self.cluster: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.lock = threading.Lock()

    def mark(self, table: dict[str, float], name: str) -> None:
        with self.lock:
            table.setdefault(name, time.time())

    def mark_created(self, obj: dict[str, Any]) -> None:
        # creationTimestamp, not first-seen: a watch that restarts under load would see
        # some objects late and shorten their times (1 s resolution, both sides alike).
        stamp = obj["metadata"]["creationTimestamp"].replace("Z", "+00:00")
        with self.lock:
            self.created.setdefault(obj["metadata"]["name"],
                                    dt.datetime.fromisoformat(stamp).timestamp())


def _watch(fn: Any, ns: str, plural: str | None, on_event: Any, stop: threading.Event) -> None:
    w = watch.Watch()
    while not stop.is_set():
        kwargs: dict[str, Any] = {"timeout_seconds": 5}
        args: tuple[Any, ...] = ("ray.io", "v1", ns, plural) if plural else (ns,)
        if plural and plural.startswith("grpo"):
            args = ("grpo.dev", "v1alpha1", ns, plural)
        try:
            for ev in w.stream(fn, *args, **kwargs):
                on_event(ev["type"], ev["object"])
                if stop.is_set():
                    break
        except Exception as exc:  # a dropped watch: log it and watch again (re-lists)
            logging.warning("watch %s restarted after %s %s", plural,
                            getattr(exc, "status", ""), getattr(exc, "reason", exc))


def grpojobs(n: int) -> list[dict[str, Any]]:
    base = example_job()
    out = []
    for i in range(n):
        doc = copy.deepcopy(base)
        doc["metadata"] = {"name": f"job-{i}", "namespace": NS}
        out.append(doc)
    return out


def rayjobs(n: int, head: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for i in range(n):
        out.append({
            "apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": f"job-{i}", "namespace": BASE_NS},
            "spec": {
                "entrypoint": "python -m grpo_trainer --config /etc/grpo/config.yaml",
                "shutdownAfterJobFinishes": False,
                "rayClusterSpec": {
                    "rayVersion": "2.60.0",
                    "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {
                        "containers": [{"name": "ray-head", "image": "rayproject/ray:2.60.0",
                                        "resources": head}]}}},
                },
            },
        })
    return out


def create_all(docs: list[dict[str, Any]], group: str, version: str, plural: str) -> None:
    """Create concurrently, as many clients would (kubectl applies one at a time)."""
    custom = client.CustomObjectsApi()
    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda d: custom.create_namespaced_custom_object(
            group, version, d["metadata"]["namespace"], plural, d), docs))
    logging.info("created %d %s in %.1f s", len(docs), plural, time.monotonic() - t0)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def summarize(sw: Stopwatch) -> dict[str, float]:
    to_cluster = [sw.cluster[n] - sw.created[n] for n in sw.created if n in sw.cluster]
    to_running = [sw.running[n] - sw.created[n] for n in sw.created if n in sw.running]
    return {
        "n": len(sw.created), "cluster_p50": pct(to_cluster, 0.5),
        "cluster_p99": pct(to_cluster, 0.99), "running_p50": pct(to_running, 0.5),
        "running_p99": pct(to_running, 0.99),
        "running_mean": statistics.fmean(to_running),
    }


def run_grpojobs(tb: Testbed, op: OperatorProcess, n: int) -> dict[str, float]:
    tb.kubectl("create", "namespace", NS)
    sw, stop = Stopwatch(), threading.Event()
    custom = client.CustomObjectsApi()

    def on_job(t: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        sw.mark_created(obj)
        if (obj.get("status") or {}).get("phase") == Phase.RUNNING:
            sw.mark(sw.running, name)

    def on_rc(t: str, obj: dict[str, Any]) -> None:
        sw.mark(sw.cluster, obj["metadata"]["labels"]["grpo.dev/job"])

    threads = [threading.Thread(target=_watch, args=(custom.list_namespaced_custom_object,
                                                     NS, p, f, stop), daemon=True)
               for p, f in (("grpojobs", on_job), ("rayclusters", on_rc))]
    for t in threads:
        t.start()
    time.sleep(1)
    create_all(grpojobs(n), "grpo.dev", "v1alpha1", "grpojobs")
    wait_until(f"{n} GRPOJobs Running", lambda: len(sw.running) >= n, 900)
    stop.set()
    return summarize(sw)


def run_rayjobs(tb: Testbed, n: int, head: dict[str, Any]) -> dict[str, float]:
    tb.kubectl("create", "namespace", BASE_NS)
    sw, stop = Stopwatch(), threading.Event()
    custom = client.CustomObjectsApi()

    def on_job(t: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        sw.mark_created(obj)
        if (obj.get("status") or {}).get("jobDeploymentStatus") == "Running":
            sw.mark(sw.running, name)

    def on_rc(t: str, obj: dict[str, Any]) -> None:
        owner = (obj["metadata"].get("ownerReferences") or [{}])[0].get("name")
        if owner:
            sw.mark(sw.cluster, owner)

    threads = [threading.Thread(target=_watch, args=(custom.list_namespaced_custom_object,
                                                     BASE_NS, p, f, stop), daemon=True)
               for p, f in (("rayjobs", on_job), ("rayclusters", on_rc))]
    for t in threads:
        t.start()
    time.sleep(1)
    create_all(rayjobs(n, head), "ray.io", "v1", "rayjobs")
    wait_until(f"{n} RayJobs Running", lambda: len(sw.running) >= n, 900)
    stop.set()
    return summarize(sw)


def proc_usage(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    hwm_kib = int(next(ln.split()[1] for ln in status.splitlines() if ln.startswith("VmHWM")))
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    return hwm_kib / 1024, ticks / 100


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", type=int, default=200)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    with running_testbed() as tb:
        config.load_kube_config(str(tb.kubeconfig))
        tb.apply(bulk_cpu_nodes(8))
        tb.apply(yaml.safe_load((REPO / "crds" / "grpojob.yaml").read_text()), server_side=True)
        tb.kubectl("wait", "--for", "condition=established", "crd/grpojobs.grpo.dev")
        op = OperatorProcess(tb, Path(tempfile.mkdtemp(prefix="bench-op-"))).start()
        try:
            ours = run_grpojobs(tb, op, args.jobs)
            assert op.proc is not None
            rss_mib, cpu_s = proc_usage(op.proc.pid)
        finally:
            op.stop()
            for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
                tb.kubectl("delete", kind, "grpo.dev", "--ignore-not-found", check=False)
        head_res = {"limits": {"cpu": "4", "memory": "13Gi"},
                    "requests": {"cpu": "4", "memory": "13Gi"}}
        base = run_rayjobs(tb, args.jobs, head_res)
    print(f"\n{args.jobs} objects created at once; seconds from creation (client watch)")
    print(f"{'':28}{'GRPOJob (ours)':>16}{'RayJob (KubeRay)':>18}{'ratio':>8}")
    for key, label in (("cluster_p50", "RayCluster exists p50"),
                       ("cluster_p99", "RayCluster exists p99"),
                       ("running_p50", "Running p50"), ("running_p99", "Running p99")):
        ratio = ours[key] / base[key] if base[key] else float("inf")
        print(f"{label:28}{ours[key]:>16.2f}{base[key]:>18.2f}{ratio:>7.2f}x")
    print(f"operator peak RSS {rss_mib:.0f} MiB, CPU time {cpu_s:.1f} s for {args.jobs} jobs")


if __name__ == "__main__":
    main()
