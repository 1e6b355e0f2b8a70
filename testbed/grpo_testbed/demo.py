"""`grpo-testbed demo` (what `make demo` runs): the tiny job, narrated stage by stage."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from grpo_api.contract import Phase

from .tiny_job import EXAMPLE, JOB, JOB_NS, OOM_STEP, TERMINAL, tiny_job_testbed

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


def run_demo(out: Path, oom_step: int | None = None) -> int:
    t0 = time.monotonic()
    step_no = iter(range(1, 10))

    def stage(text: str) -> None:
        console.rule(f"[bold][{next(step_no)}/6] {text}  (t+{time.monotonic() - t0:.0f} s)")

    oom_at = oom_step or OOM_STEP
    with tempfile.TemporaryDirectory(prefix="grpo-demo-") as tmp:
        stage("testbed: API server, etcd, scheduler, controller-manager, KubeRay, kwok GPU "
              "nodes and the local node whose pods really run")
        with tiny_job_testbed(Path(tmp), oom_at) as tj:
            tj.say = console.print
            console.print(f"    local node agent: pods run under {tj.agent.workdir}")
            stage("helm install the chart; start the operator as the chart's ServiceAccount")
            tj.install_chart()
            tj.start_operator()
            console.print(f"    operator log: {tj.operator.log if tj.operator else '-'}")
            stage(f"build the tiny Qwen2.5-VL + dataset on claim tiny-assets; kubectl apply "
                  f"-f {EXAMPLE.relative_to(EXAMPLE.parents[1])}")
            tj.build_assets()
            tj.apply_job()
            console.print(f"    attempt 0's head is OOM-killed at step {oom_at} "
                          "(testbed fault switch GRPO_FAULT_INJECT=host_oom; the kernel kills "
                          "it at the pod's memory limit)")
            stage("kubectl get grpojobs -w: training until the OOM kill and the restart")
            job = tj.watch(lambda j: (j.get("status", {}).get("attempt") or 0) >= 1
                           or j.get("status", {}).get("phase") in TERMINAL, 600,
                           "the operator to start attempt 1")
            for rec in job["status"].get("attempts", [])[:-1]:
                console.print("    " + _attempt_line(rec))
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
                for attempt in sorted(tj.head_runs()):
                    tail = tj.head_log(attempt).splitlines()[-25:]
                    console.print(f"--- trainer log, attempt {attempt}:\n" + "\n".join(tail))
                return 1
            stage("export the trained model (Hugging Face safetensors + processor)")
            console.print("    " + tj.export(out))
            console.print(f"[bold green]    model: {out}[/]  (load it with transformers "
                          "AutoModelForImageTextToText.from_pretrained)")
            console.print("    tearing down: job, operator, chart, testbed")
    console.print(f"[bold]demo finished in {time.monotonic() - t0:.0f} s[/]")
    return 0

