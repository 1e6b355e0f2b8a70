"""`grpo-testbed demo` (what `make demo` runs): the tiny job, narrated stage by stage."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from grpo_api.contract import ATTEMPT_EVENTS, Phase, Role

from .tiny_job import (
    EXAMPLE,
    JOB,
    JOB_NS,
    LEAK_MIB,
    LEAK_STEP,
    TERMINAL,
    TinyJob,
    multipod_example,
    tiny_job_testbed,
    worker_oom,
)

console = Console(highlight=False)


def _attempt_line(rec: dict[str, Any]) -> str:
    bits = [f"attempt {rec['index']}: {rec.get('outcome')}"]
    for key in ("step", "lastCheckpointStep"):
        if rec.get(key) is not None:
            bits.append(f"{key}={rec[key]}")
    if rec.get("remediation"):
        bits.append(f"then: {rec['remediation']}")
    return ", ".join(bits) + (f"\n      {rec['reason']}" if rec.get("reason") else "")


def _resume_line(log: str) -> str:
    for line in log.splitlines():
        if "resum" in line.lower() and "step" in line.lower():
            return line.strip()
    return "(no resume line in the trainer log)"


ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")  # `ray start` colours its lines


def _log_line(log: str) -> str:
    """The line of a worker's log that says what it is: Ray joining the head."""
    lines = [x.strip() for x in ANSI_COLOUR.sub("", log).splitlines() if x.strip()]
    chosen = next((x for x in lines if "Ray runtime started" in x), None)
    return chosen or (lines[-1] if lines else "(no output yet)")


def _training(job: dict[str, Any]) -> bool:
    st = job.get("status") or {}
    return int((st.get("progress") or {}).get("step") or 0) >= 1 or \
        (st.get("attempt") or 0) >= 1 or st.get("phase") in TERMINAL


def _show_pods(tj: TinyJob) -> None:
    console.print("    $ kubectl get pods -n grpo-demo / -n grpo-system -o wide (with images)")
    for line in tj.kubectl_pods_wide().splitlines():
        console.print("    " + escape(line))
    workers = [p["metadata"]["name"] for p in tj.pods(attempt=0, role=Role.WORKER)]
    for name in workers[:1]:
        line = _log_line(tj.kubectl_logs(name))
        console.print(f"    $ kubectl logs -n {JOB_NS} {name}\n      {escape(line)}")


def _show_kill(tj: TinyJob) -> None:
    for e in tj.terminations(0):
        console.print(f"    kubectl get pods showed {e.pod} ({e.role.value}): {e.reason}, "
                      f"exit {e.exit_code}")


# What the demo's testbed does not run (its job has no queue, its images are imported into
# the node's store): `make demo` does not build them (`grpo-testbed build --for-demo`), 335 s
# of a cold build (docs/benchmarks.md); `make test` builds them.
DEMO_SKIPS = frozenset({"kueue", "registry", "versitygw"})
ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray's colours in the kept output


def _show_kept_logs(tj: TinyJob, job: dict[str, Any]) -> None:
    """Attempt 0's pods are gone; their output is on the claim, where its record says."""
    where = job["status"]["attempts"][0].get("logs")
    kept = tj.kept_logs(0) if where else {}
    console.print(f"    status.attempts[0].logs: {where} ({', '.join(kept) or 'nothing'})")
    for pod, text in kept.items():
        if "-head-" in pod:
            lines = [ANSI.sub("", ln).strip() for ln in text.splitlines()]
            steps = [ln for ln in lines if ln.startswith("{") and '"step"' in ln]
            last = steps[-1][:100] + " ..." if steps else "no step line"
            console.print(f"    read back from the claim: {pod}.log, {len(lines)} lines; the "
                          f"driver's last step line: {escape(last)}")
    events = tj.kept_dir(0) / ATTEMPT_EVENTS if where else None
    if events is not None and events.exists():
        lines = events.read_text(errors="replace").splitlines()
        oom = [ln for ln in lines if "OOM" in ln or "Restart" in ln]
        console.print(f"    and its events: {ATTEMPT_EVENTS}, {len(lines)} lines"
                      + (f"; {escape(oom[-1][:110])}" if oom else ""))


def run_demo(out: Path, leak_step: int | None = None) -> int:
    t0 = time.monotonic()
    step_no = iter(range(1, 10))

    def stage(text: str) -> None:
        console.rule(f"[bold][{next(step_no)}/6] {text}  (t+{time.monotonic() - t0:.0f} s)")

    leak_at = leak_step or LEAK_STEP
    with tempfile.TemporaryDirectory(prefix="grpo-demo-") as tmp:
        stage("testbed: API server, etcd, scheduler, controller-manager, KubeRay, "
              "kwok GPU nodes, and a real node (kubelet + containerd) with the product's "
              "images")
        with tiny_job_testbed(Path(tmp), worker_oom(leak_at), with_kueue=False,
                              with_registry=False, with_s3=False) as tj:
            tj.say = console.print
            stage("helm install the chart: the operator runs in the cluster from its image")
            tj.install_chart()
            stage(f"build the tiny Qwen2.5-VL + dataset on claim tiny-assets; kubectl apply "
                  f"-f {EXAMPLE.relative_to(EXAMPLE.parents[1])} with one worker pod")
            tj.build_assets()
            manifest = tj.apply_job(multipod_example())
            console.print(f"    applied {manifest} (resources: nodes 1, cpusPerNode 1, "
                          "hostMemory 13Gi: a CPU head pod and a worker pod)")
            console.print(f"    attempt 0's worker pod runs out of memory: from step {leak_at} "
                          f"its two ranks keep {LEAK_MIB} MiB more each step (testbed fault "
                          "switch: GRPO_FAULT_INJECT=leak_host in attempt 0's head pod, "
                          "RAY_memory_monitor_refresh_ms=0 in its worker pod, so Ray kills "
                          "nothing first and the kernel kills the pod at its memory limit)")
            stage("kubectl get grpojobs -w: training until the OOM kill and the restart")
            tj.watch(_training, 600, "attempt 0 to train")
            _show_pods(tj)
            job = tj.watch(lambda j: (j.get("status", {}).get("attempt") or 0) >= 1
                           or j.get("status", {}).get("phase") in TERMINAL, 600,
                           "the operator to start attempt 1")
            _show_kill(tj)
            for rec in job["status"].get("attempts", [])[:-1]:
                console.print("    " + _attempt_line(rec))
            _show_kept_logs(tj, job)
            stage("attempt 1 resumes from the last checkpoint and finishes")
            job = tj.watch(lambda j: j.get("status", {}).get("phase") in TERMINAL, 900,
                           "the job to finish")
            console.print("    trainer, attempt 1: " + _resume_line(tj.head_log(1)))
            rewards = [p["rewardMean"] for j in tj.seen
                       if (p := j.get("status", {}).get("progress") or {}).get("rewardMean")
                       is not None]
            if rewards:
                console.print(f"    reward mean: {rewards[0]:.3f} at the first report, "
                              f"{rewards[-1]:.3f} at the last")
            phase = job["status"]["phase"]
            console.print(f"    {JOB_NS}/{JOB}: {phase}; attempts:")
            for rec in job["status"].get("attempts", []):
                console.print("      " + _attempt_line(rec))
            if phase != Phase.SUCCEEDED:
                for attempt in sorted({0, *range(len(job["status"].get("attempts", [])))}):
                    tail = tj.head_log(attempt).splitlines()[-25:]
                    console.print(f"--- trainer log, attempt {attempt}:\n" + "\n".join(tail))
                return 1
            stage("the model the trainer exported (status.export: Hugging Face safetensors "
                  "+ processor)")
            export = job["status"]["export"]
            console.print(f"    status.export: claim {export['claimName']}, path "
                          f"{export['path']}, step {export['step']}")
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(tj.exported_dir(), out)
            console.print(f"[bold green]    model: {out}[/]  (load it with transformers "
                          "AutoModelForImageTextToText.from_pretrained)")
            console.print("    tearing down: job, chart, testbed")
    console.print(f"[bold]demo finished in {time.monotonic() - t0:.0f} s[/]")
    return 0
