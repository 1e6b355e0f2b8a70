"""GRPOJobs at once through the operator vs as many RayJobs through KubeRay alone (200, or
a scale curve: ``--jobs 50,200,1000``).

Per object, seconds from its creation until its RayCluster exists, its checkpoint claim
is Bound, its head pod is scheduled and running, and the object is Running (GRPOJob
phase Running; RayJob jobDeploymentStatus Running): the stages say where a gap opens.
Also the operator's peak RSS and CPU time (its admission process's beside it, and both
together: their PSS, what the pod's memory cgroup is charged), and how long the creates
took (each GRPOJob create goes through the admission webhooks). Both runs share one
testbed, one after the other, on enough extra fake CPU nodes that scheduling never waits
for capacity. The
baseline's head pods mount a claim created with each RayJob, as each GRPOJob's do
(`--no-baseline-claims`: none, as before 2026-11-27).

    .venv/bin/python bench/bench_operator.py [--jobs 200] [--no-baseline-claims]
        [--order ours-first|kuberay-first] [--provisioner kwok|testbed]
    .venv/bin/python bench/bench_operator.py --jobs 50,200,1000 \\
        --json bench/plots/operator_scale.jsonl --plot bench/plots/operator_scale.png

``--order``: which side runs first on the fresh testbed (the first pays for a cold
provisioner and caches). ``--provisioner``: who provisions the default StorageClass's
claims, for both sides: kwok's volume stages (one serial worker, four writes a claim), or
the testbed's external-provisioner with kube-controller-manager binding, as on a real
cluster (the default; grpo_testbed/provisioner.py; bench/bench_claims.py compares the two
alone). ``--tracemalloc``: where the operator's memory is, by source file. A scale curve
adds, per count, the operator's RSS and CPU seconds per job and its reconcile time (p50,
p99: its own histogram, grpo_operator_reconcile_duration_seconds), plotted by
plot_scale.py.
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import logging
import os
import signal
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client, config, watch
from operator_probes import (  # bench/
    PssPeak,
    children,
    histogram_quantile,
    proc_usage,
    sample_operator,
)

from grpo_api.contract import Phase
from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed, running_testbed
from grpo_testbed.nodes import bulk_cpu_nodes
from grpo_testbed.operator_process import OperatorProcess
from grpo_testbed.processes import wait_until
from grpo_testbed.provisioner import VolumeProvisioner, storage_class

REPO = Path(__file__).resolve().parents[1]
NS = "op-bench"
BASE_NS = "rayjob-bench"


STAGES = ("cluster", "claim", "scheduled", "head", "running")
STAGE_LABELS = {"cluster": "RayCluster exists", "claim": "claim Bound",
                "scheduled": "head pod scheduled", "head": "head pod Running",
                "running": "Running"}
BENCH_JOB_LABEL = "bench.grpo.dev/job"  # the baseline's claims and head pods


class Stopwatch:
    """Per object name: its creation as the API server recorded it, and the first time a
    client watch saw each later stage (wall clock, one machine)."""

    def __init__(self) -> None:
        self.created: dict[str, float] = {}
        self.stages: dict[str, dict[str, float]] = {s: {} for s in STAGES}
        self.cluster_job: dict[str, str] = {}  # RayCluster name -> object name
        self.lock = threading.Lock()

    def mark(self, stage: str, name: str | None) -> None:
        if name:
            with self.lock:
                self.stages[stage].setdefault(name, time.time())

    def mark_created(self, obj: dict[str, Any]) -> None:
        # creationTimestamp, not first-seen: a watch that restarts under load would see
        # some objects late and shorten their times (1 s resolution, both sides alike).
        stamp = obj["metadata"]["creationTimestamp"].replace("Z", "+00:00")
        with self.lock:
            self.created.setdefault(obj["metadata"]["name"],
                                    dt.datetime.fromisoformat(stamp).timestamp())

    def on_claim(self, _: str, obj: dict[str, Any]) -> None:
        labels = obj["metadata"].get("labels") or {}
        if (obj.get("status") or {}).get("phase") == "Bound":
            self.mark("claim", labels.get("grpo.dev/job") or labels.get(BENCH_JOB_LABEL))

    def on_pod(self, _: str, obj: dict[str, Any]) -> None:
        labels = obj["metadata"].get("labels") or {}
        if labels.get("ray.io/node-type") != "head":
            return
        name = self.cluster_job.get(labels.get("ray.io/cluster", ""))
        if obj.get("spec", {}).get("nodeName"):
            self.mark("scheduled", name)
        if (obj.get("status") or {}).get("phase") == "Running":
            self.mark("head", name)


def _watch(fn: Any, args: tuple[str, ...], on_event: Any, stop: threading.Event) -> None:
    w = watch.Watch()
    while not stop.is_set():
        try:
            for ev in w.stream(fn, *args, timeout_seconds=5):
                on_event(ev["type"], ev["raw_object"])  # dicts, typed API or not
                if stop.is_set():
                    break
        except Exception as exc:  # a dropped watch: log it and watch again (re-lists)
            logging.warning("watch %s restarted after %s %s", args,
                            getattr(exc, "status", ""), getattr(exc, "reason", exc))


def grpojobs(n: int) -> list[dict[str, Any]]:
    base = example_job()
    out = []
    for i in range(n):
        doc = copy.deepcopy(base)
        doc["metadata"] = {"name": f"job-{i}", "namespace": NS}
        out.append(doc)
    return out


def rayjobs(n: int, head: dict[str, Any], claims: bool) -> list[dict[str, Any]]:
    """Each RayJob, preceded by its checkpoint claim when `claims` (mounted by its head
    pod, as a GRPOJob's claim is)."""
    out: list[dict[str, Any]] = []
    for i in range(n):
        name, labels = f"job-{i}", {BENCH_JOB_LABEL: f"job-{i}"}
        container: dict[str, Any] = {"name": "ray-head", "image": "rayproject/ray:2.60.0",
                                     "resources": head}
        pod: dict[str, Any] = {"containers": [container]}
        if claims:
            out.append({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": f"{name}-ckpt", "namespace": BASE_NS, "labels": labels},
                "spec": {"accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}},
            })
            container["volumeMounts"] = [{"name": "ckpt", "mountPath": "/checkpoints"}]
            pod["volumes"] = [{"name": "ckpt",
                               "persistentVolumeClaim": {"claimName": f"{name}-ckpt"}}]
        out.append({
            "apiVersion": "ray.io/v1", "kind": "RayJob",
            "metadata": {"name": name, "namespace": BASE_NS},
            "spec": {
                "entrypoint": "python -m grpo_trainer --config /etc/grpo/config.yaml",
                "shutdownAfterJobFinishes": False,
                "rayClusterSpec": {
                    "rayVersion": "2.60.0",
                    "headGroupSpec": {"rayStartParams": {}, "template": {
                        "metadata": {"labels": labels}, "spec": pod}},
                },
            },
        })
    return out


def create_all(docs: list[dict[str, Any]], group: str, version: str, plural: str) -> float:
    """Create concurrently, as many clients would (kubectl applies one at a time); a
    claim goes in just before the object after it. Returns the seconds it took."""
    custom, core = client.CustomObjectsApi(), client.CoreV1Api()

    def create(d: dict[str, Any]) -> None:
        ns = d["metadata"]["namespace"]
        if d["kind"] == "PersistentVolumeClaim":
            core.create_namespaced_persistent_volume_claim(ns, cast(Any, d))
        else:
            custom.create_namespaced_custom_object(group, version, ns, plural, d)

    units: list[list[dict[str, Any]]] = []
    for d in docs:  # a claim and the object that mounts it, created in that order
        if units and units[-1][-1]["kind"] == "PersistentVolumeClaim":
            units[-1].append(d)
        else:
            units.append([d])
    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda unit: list(map(create, unit)), units))
    took = time.monotonic() - t0
    logging.info("created %d %s in %.1f s", len(units), plural, took)
    return took


def running_limit(n: int) -> float:
    """How long n objects may take to reach Running: 15 minutes a 200."""
    return 900.0 * max(1.0, n / 200)


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def webhook_seconds(tb: Testbed) -> dict[str, tuple[int, float]]:
    """Per admission webhook: requests and total seconds, as the API server timed them
    (apiserver_admission_webhook_admission_duration_seconds)."""
    out: dict[str, tuple[int, float]] = {}
    metric = "apiserver_admission_webhook_admission_duration_seconds"
    for line in tb.kubectl("get", "--raw", "/metrics").stdout.splitlines():
        for suffix in ("_count", "_sum"):
            if line.startswith(metric + suffix + "{"):
                labels, value = line[len(metric + suffix) + 1:].rsplit("} ", 1)
                name = next(p.split("=", 1)[1].strip('"') for p in labels.split(",")
                            if p.startswith("name="))
                count, total = out.get(name, (0, 0.0))  # summed over operations
                out[name] = ((count + int(float(value)), total) if suffix == "_count"
                             else (count, total + float(value)))
    return out


def summarize(sw: Stopwatch, create_s: float) -> dict[str, float]:
    out = {"n": float(len(sw.created)), "create_s": create_s}
    for stage in STAGES:
        seen = sw.stages[stage]
        took = [seen[n] - sw.created[n] for n in sw.created if n in seen]
        if took:
            out[f"{stage}_p50"], out[f"{stage}_p99"] = pct(took, 0.5), pct(took, 0.99)
    return out


def watch_stages(sw: Stopwatch, ns: str, jobs: tuple[str, str, str],
                 on_job: Any, on_rc: Any) -> threading.Event:
    """Watches of the jobs, their RayClusters, claims and pods; set the event to stop."""
    stop = threading.Event()
    custom, core = client.CustomObjectsApi(), client.CoreV1Api()
    watches: list[tuple[Any, tuple[str, ...], Any]] = [
        (custom.list_namespaced_custom_object, (*jobs[:2], ns, jobs[2]), on_job),
        (custom.list_namespaced_custom_object, ("ray.io", "v1", ns, "rayclusters"), on_rc),
        (core.list_namespaced_persistent_volume_claim, (ns,), sw.on_claim),
        (core.list_namespaced_pod, (ns,), sw.on_pod),
    ]
    for fn, args, handler in watches:
        threading.Thread(target=_watch, args=(fn, args, handler, stop), daemon=True).start()
    return stop


def run_grpojobs(tb: Testbed, op: OperatorProcess, n: int) -> dict[str, float]:
    tb.kubectl("create", "namespace", NS)
    sw = Stopwatch()

    def on_job(_: str, obj: dict[str, Any]) -> None:
        sw.mark_created(obj)
        if (obj.get("status") or {}).get("phase") == Phase.RUNNING:
            sw.mark("running", obj["metadata"]["name"])

    def on_rc(_: str, obj: dict[str, Any]) -> None:
        job = obj["metadata"]["labels"]["grpo.dev/job"]
        sw.cluster_job[obj["metadata"]["name"]] = job
        sw.mark("cluster", job)

    stop = watch_stages(sw, NS, ("grpo.dev", "v1alpha1", "grpojobs"), on_job, on_rc)
    time.sleep(1)
    took = create_all(grpojobs(n), "grpo.dev", "v1alpha1", "grpojobs")
    for hook, (count, total) in webhook_seconds(tb).items():
        logging.info("API server: webhook %s answered %d requests, mean %.1f ms", hook,
                     count, 1000 * total / max(count, 1))
    wait_until(f"{n} GRPOJobs Running", lambda: len(sw.stages["running"]) >= n, running_limit(n))
    stop.set()
    return summarize(sw, took)


def run_rayjobs(tb: Testbed, n: int, head: dict[str, Any], claims: bool) -> dict[str, float]:
    tb.kubectl("create", "namespace", BASE_NS)
    sw = Stopwatch()

    def on_job(_: str, obj: dict[str, Any]) -> None:
        sw.mark_created(obj)
        if (obj.get("status") or {}).get("jobDeploymentStatus") == "Running":
            sw.mark("running", obj["metadata"]["name"])

    def on_rc(_: str, obj: dict[str, Any]) -> None:
        owner = (obj["metadata"].get("ownerReferences") or [{}])[0].get("name")
        if owner:
            sw.cluster_job[obj["metadata"]["name"]] = owner
            sw.mark("cluster", owner)

    stop = watch_stages(sw, BASE_NS, ("ray.io", "v1", "rayjobs"), on_job, on_rc)
    time.sleep(1)
    took = create_all(rayjobs(n, head, claims), "ray.io", "v1", "rayjobs")
    wait_until(f"{n} RayJobs Running", lambda: len(sw.stages["running"]) >= n, running_limit(n))
    stop.set()
    return summarize(sw, took)


def nodes_for(jobs: int) -> int:
    """Fake 512-CPU nodes enough that no head pod waits for capacity: 8 up to 200 jobs
    (20 CPUs a job), as many more beyond."""
    return max(8, -(-jobs * 20 // 512))


def measure(jobs: int, order: str, provisioner_kind: str, baseline_claims: bool,
            tracemalloc: bool = False, py_spy: Path | None = None) -> dict[str, Any]:
    """One count on a fresh testbed: both sides' stage times, the operator's memory, CPU
    and reconcile times."""
    load_before = os.getloadavg()[0]
    with running_testbed() as tb:
        config.load_kube_config(str(tb.kubeconfig))
        tb.apply(bulk_cpu_nodes(nodes_for(jobs)))
        provisioner = None
        if provisioner_kind == "testbed":  # the default class, for both sides' claims
            tb.kubectl("annotate", "storageclass", "kwok-volume",
                       "storageclass.kubernetes.io/is-default-class-", check=False)
            tb.apply([storage_class(default=True)])
            provisioner = VolumeProvisioner(tb.kubeconfig).start()
        tb.apply(yaml.safe_load((REPO / "crds" / "grpojob.yaml").read_text()), server_side=True)
        # (Retried: right after the apply the CRD may not be served for a wait yet.)
        wait_until("the GRPOJob CRD established", lambda: tb.kubectl(
            "wait", "--for", "condition=established", "--timeout", "10s",
            "crd/grpojobs.grpo.dev", check=False).returncode == 0, 60)
        head_res = {"limits": {"cpu": "4", "memory": "13Gi"},
                    "requests": {"cpu": "4", "memory": "13Gi"}}
        usage: dict[str, float] = {}

        def run_ours() -> dict[str, float]:
            env = {"PYTHONTRACEMALLOC": "16"} if tracemalloc else None
            op = OperatorProcess(tb, Path(tempfile.mkdtemp(prefix="bench-op-")), env=env).start()
            try:
                assert op.proc is not None
                _, usage["idle_rss_mib"], _ = proc_usage(op.proc.pid)
                pss = PssPeak(op.proc.pid)
                spy = sample_operator(op.proc.pid, py_spy) if py_spy else None
                found = run_grpojobs(tb, op, jobs)
                if spy is not None:
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=60)
                usage["pss_peak_mib"] = pss.stop()
                usage.update(pss.at_peak)
                usage["rss_mib"], _, usage["operator_cpu_s"] = proc_usage(op.proc.pid)
                usage["cpu_s"] = usage["operator_cpu_s"]
                for child in children(op.proc.pid):  # the admission process
                    usage["admission_rss_mib"], _, cpu = proc_usage(child)
                    usage["cpu_s"] += cpu
                scrape = op.metrics()
                for q in (0.5, 0.99):
                    usage[f"reconcile_p{round(q * 100)}_s"] = histogram_quantile(
                        scrape, "grpo_operator_reconcile_duration_seconds", q)
                if tracemalloc:  # heap_report.py: the live allocations by file
                    os.kill(op.proc.pid, signal.SIGUSR2)
                    # Grouping by call path takes a while on a traced heap of this size.
                    deadline = time.monotonic() + 180
                    while "heap: path" not in op.log.read_text() and time.monotonic() < deadline:
                        time.sleep(2)
                    time.sleep(2)
                    print("\n".join(line for line in op.log.read_text().splitlines()
                                    if "heap:" in line))
                return found
            finally:
                op.stop()
                for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
                    tb.kubectl("delete", kind, "grpo.dev", "--ignore-not-found", check=False)

        try:
            if order == "kuberay-first":
                base = run_rayjobs(tb, jobs, head_res, baseline_claims)
                ours = run_ours()
            else:
                ours = run_ours()
                base = run_rayjobs(tb, jobs, head_res, baseline_claims)
        finally:
            if provisioner is not None:
                provisioner.stop()
    return {"jobs": jobs, "order": order, "provisioner": provisioner_kind,
            "baseline_claims": baseline_claims, "ours": ours, "base": base, **usage,
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
            "finished": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")}


def report(r: dict[str, Any]) -> None:
    jobs, ours, base = r["jobs"], r["ours"], r["base"]
    claims = "each mounting a claim created with it" if r["baseline_claims"] else "no claims"
    print(f"\n{jobs} objects created at once (baseline RayJobs: {claims}; {r['order']}; "
          f"claims provisioned by {r['provisioner']}); seconds from creation (client watch)")
    print(f"{'':30}{'GRPOJob (ours)':>16}{'RayJob (KubeRay)':>18}{'ratio':>8}")
    rows = [(f"{stage}_{q}", f"{STAGE_LABELS[stage]} {q}") for stage in STAGES
            for q in ("p50", "p99")] + [("create_s", "creating them all took")]
    for key, label in rows:
        if key not in ours or key not in base:
            print(f"{label:30}{ours.get(key, float('nan')):>16.2f}"
                  f"{base.get(key, float('nan')):>18.2f}")
            continue
        ratio = ours[key] / base[key] if base[key] else float("inf")
        print(f"{label:30}{ours[key]:>16.2f}{base[key]:>18.2f}{ratio:>7.2f}x")
    print(f"operator peak RSS {r['rss_mib']:.0f} MiB (idle {r['idle_rss_mib']:.0f}; "
          f"{(r['rss_mib'] - r['idle_rss_mib']) / jobs * 1024:.0f} KiB a job), its admission "
          f"process's {r.get('admission_rss_mib', 0):.0f} MiB; both together (PSS, shared "
          f"pages once) peak {r.get('pss_peak_mib', float('nan')):.0f} MiB")
    if "operator_pss_anon_mib" in r:
        anon, file = r.get("admission_pss_anon_mib", 0), r.get("admission_pss_file_mib", 0)
        print("  at that peak, PSS anonymous / file-backed (MiB): operator "
              f"{r['operator_pss_anon_mib']:.0f} / {r['operator_pss_file_mib']:.0f}, "
              f"admission {anon:.0f} / {file:.0f}")
    print(f"CPU time of both {r['cpu_s']:.1f} s ({r['cpu_s'] / jobs * 1000:.0f} ms a job; "
          f"the operator's {r.get('operator_cpu_s', r['cpu_s']):.1f} s), reconcile p50 "
          f"{r['reconcile_p50_s'] * 1000:.0f} ms / p99 {r['reconcile_p99_s'] * 1000:.0f} ms")
    print(f"load average before / after: {r['load_before']:.2f} / {r['load_after']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", default="200",
                    help="objects per side; a comma list (50,200,1000) is a scale curve, "
                         "each count on a fresh testbed")
    ap.add_argument("--baseline-claims", action=argparse.BooleanOptionalAction, default=True,
                    help="mount a claim created with each RayJob in its head pod")
    ap.add_argument("--order", choices=("ours-first", "kuberay-first"), default="ours-first")
    ap.add_argument("--provisioner", choices=("kwok", "testbed"), default="testbed")
    ap.add_argument("--tracemalloc", action="store_true",
                    help="trace the operator's allocations and print them by file at the end "
                         "(slower; its RSS figure then includes tracing's own)")
    ap.add_argument("--py-spy", type=Path, default=None, metavar="FILE",
                    help="sample the operator with py-spy while its jobs start (collapsed "
                         "stacks into FILE; bench/profile_shares.py-style reading)")
    ap.add_argument("--json", type=Path, default=None,
                    help="append each count's results to this file, one JSON line each")
    ap.add_argument("--plot", type=Path, default=None,
                    help="draw the scale curve of every line in --json to this PNG "
                         "(bench/plot_scale.py)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    for jobs in (int(j) for j in str(args.jobs).split(",")):
        result = measure(jobs, args.order, args.provisioner, args.baseline_claims,
                         args.tracemalloc, args.py_spy)
        report(result)
        if args.json is not None:
            with args.json.open("a") as out:
                out.write(json.dumps(result) + "\n")
    if args.plot is not None and args.json is not None:
        from plot_scale import plot_scale

        plot_scale([json.loads(line) for line in args.json.read_text().splitlines()],
                   args.plot)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
