"""One admission's CPU, in process: the webhook's review of each example job against a
baseline measured in the same run.

Baseline: the review as it was until 2026-11-27: parse and plan, then render all of the
job's children (ConfigMap with the trainer config, claim, RBAC, RayCluster) and read
them back with PyYAML's pure-Python loader and dumper, then parse again for the
warnings. Measured: `review_admission` as the webhook runs it now (one parse; only the
RayCluster rendered; libyaml). Both check the same namespace rules (Pod Security
`restricted`). The namespace reads and the HTTPS round trip are not in either.

    .venv/bin/python bench/bench_admission.py [--iterations N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from grpo_api.job import parse_spec
from grpo_operator.namespace_policy import NamespaceFacts, pod_security_problem, templates
from grpo_operator.reconcile import planned
from grpo_operator.render import JobRef, children, render_children
from grpo_operator.webhook import admission_warnings, review_admission

ROOT = Path(__file__).resolve().parents[1]
FACTS = NamespaceFacts("team", {"pod-security.kubernetes.io/enforce": "restricted"}, ())


@contextmanager
def pure_python_yaml() -> Iterator[None]:
    """The renderer reads and writes YAML with PyYAML's pure-Python classes."""
    fast = yaml.CSafeLoader, yaml.CSafeDumper
    yaml.CSafeLoader, yaml.CSafeDumper = yaml.SafeLoader, yaml.SafeDumper  # type: ignore[assignment,misc]
    try:
        yield
    finally:
        yaml.CSafeLoader, yaml.CSafeDumper = fast  # type: ignore[misc]


def baseline_review(spec: dict[str, Any]) -> str | None:
    parsed = parse_spec(spec)
    plan = planned(parsed)
    rc = next(c for c in render_children(parsed, plan, JobRef("job", FACTS.name, ""), 0)
              if c["kind"] == "RayCluster")
    problem = pod_security_problem(spec.get("pods") or {}, templates(rc), FACTS)
    admission_warnings(spec)
    return problem


def review_now(spec: dict[str, Any]) -> str | None:
    return review_admission(spec, None, namespace=FACTS).problem


def per_call_ms(fn: Callable[[dict[str, Any]], object], spec: dict[str, Any], n: int) -> float:
    fn(spec)
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn(spec)
        samples.append((time.perf_counter() - t0) * 1000)
    return statistics.median(samples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iterations", type=int, default=50)
    args = ap.parse_args()
    assert children.yaml is yaml  # the baseline swaps the classes the renderer reads
    print(f"load average {os.getloadavg()[0]:.2f}; median ms per admission, "
          f"{args.iterations} each")
    print(f"{'example':42}{'baseline':>10}{'now':>8}{'ratio':>8}")
    for path in sorted((ROOT / "examples").glob("grpojob-*.yaml")):
        spec = next(d for d in yaml.safe_load_all(path.read_text())
                    if d and d.get("kind") == "GRPOJob")["spec"]
        with pure_python_yaml():
            before = per_call_ms(baseline_review, spec, args.iterations)
        assert baseline_review(spec) == review_now(spec)  # the same answer, faster
        now = per_call_ms(review_now, spec, args.iterations)
        print(f"{path.name:42}{before:>10.2f}{now:>8.2f}{before / now:>7.1f}x")


if __name__ == "__main__":
    main()
