"""Planner speed: `plan_memory` per job against a named baseline measured in the same run.

Baseline: `parse-only`, validating the manifest with the pydantic models (what the
operator must do anyway for every GRPOJob). Measured: parse + plan (`grpo plan` minus
printing), for each example, for a sweep of GPU types x model sizes x node counts, and
for infeasible jobs (which also search for the smallest change that would fit).
Target: well under 100 ms per job.

    .venv/bin/python bench/bench_plan.py [--iterations N]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from collections.abc import Callable
from itertools import product
from pathlib import Path
from typing import Any

import yaml

from grpo_api.catalog import GPU_CATALOG
from grpo_api.job import parse_manifest
from grpo_operator.planner import KNOWN_MODELS, InfeasibleError, plan_memory

ROOT = Path(__file__).resolve().parents[1]
TARGET_MS = 100.0


def per_call_ms(fn: Callable[[], object], iterations: int, repeats: int = 5) -> float:
    """Median over `repeats` of the mean time per call, in ms."""
    fn()  # warm caches (pydantic validators, imports)
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(iterations):
            fn()
        samples.append((time.perf_counter() - start) / iterations * 1e3)
    return statistics.median(samples)


def plan_or_refuse(doc: dict[str, Any]) -> None:
    with contextlib.suppress(InfeasibleError):  # a refusal is a valid, timed outcome
        plan_memory(parse_manifest(doc).spec)


def sweep_docs() -> list[dict[str, Any]]:
    base = yaml.safe_load((ROOT / "examples/grpojob-qwen25vl-7b-h100.yaml").read_text())
    docs = []
    gpus = [g for g in GPU_CATALOG if g != "cpu"]
    for gpu, model, nodes in product(gpus, sorted(KNOWN_MODELS), (1, 2, 4, 8)):
        d = yaml.safe_load(yaml.safe_dump(base))
        d["spec"]["model"]["path"] = f"Qwen/{model}"
        d["spec"]["resources"].update({"gpuType": gpu, "nodes": nodes})
        docs.append(d)
    return docs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=200)
    args = ap.parse_args()
    n = args.iterations
    rows: list[tuple[str, float, float]] = []
    for path in sorted((ROOT / "examples").glob("grpojob-*.yaml")):
        doc = yaml.safe_load(path.read_text())
        base = per_call_ms(lambda doc=doc: parse_manifest(doc), n)
        full = per_call_ms(lambda doc=doc: plan_memory(parse_manifest(doc).spec), n)
        rows.append((path.name, base, full))

    docs = sweep_docs()
    refused = 0
    for d in docs:
        try:
            plan_memory(parse_manifest(d).spec)
        except InfeasibleError:
            refused += 1
    sweep_iters = max(1, n // 50)
    base = per_call_ms(lambda: [parse_manifest(d) for d in docs], sweep_iters) / len(docs)
    full = per_call_ms(lambda: [plan_or_refuse(d) for d in docs], sweep_iters) / len(docs)
    rows.append((f"sweep: {len(docs)} jobs ({refused} infeasible)", base, full))

    worst = yaml.safe_load((ROOT / "examples/grpojob-qwen2vl-72b-h100.yaml").read_text())
    worst["spec"]["resources"].update({"nodes": 1, "gpusPerNode": 1})
    base = per_call_ms(lambda: parse_manifest(worst), max(1, n // 10))
    full = per_call_ms(lambda: plan_or_refuse(worst), max(1, n // 10))
    rows.append(("infeasible 72B on 1 GPU (+ fixes search)", base, full))

    auto = yaml.safe_load((ROOT / "examples/grpojob-qwen2vl-72b-h100.yaml").read_text())
    del auto["spec"]["resources"]["nodes"], auto["spec"]["resources"]["gpusPerNode"]
    base = per_call_ms(lambda: parse_manifest(auto), max(1, n // 10))
    full = per_call_ms(lambda: plan_memory(parse_manifest(auto).spec), max(1, n // 10))
    rows.append(("72B with nodes derived", base, full))

    width = max(len(r[0]) for r in rows)
    print(f"{'job':<{width}}  {'parse-only ms':>13}  {'parse+plan ms':>13}  {'ratio':>7}")
    for name, b, f in rows:
        print(f"{name:<{width}}  {b:>13.3f}  {f:>13.3f}  {f / b:>6.1f}x")
    slowest = max(r[2] for r in rows)
    verdict = "OK" if slowest < TARGET_MS else "OVER TARGET"
    print(f"slowest parse+plan: {slowest:.2f} ms per job (target < {TARGET_MS:.0f} ms): {verdict}")


if __name__ == "__main__":
    main()
