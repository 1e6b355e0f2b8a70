"""Where the time to create many GRPOJobs goes: the same burst of creates three ways on one
testbed, against the API server alone as the baseline.

1. the CRD alone: no webhook, no operator (the baseline: the API server's own work);
2. through the admission webhooks, the operator watching another namespace (the webhooks'
   share, no reconcile beside them);
3. through the webhooks while the operator reconciles each job as it arrives (what
   `bench_operator.py` times against RayJobs).

Each burst is `--jobs` creates from 16 client threads (bench_operator.create_all), in a
namespace of its own, after an untimed burst of 20 that warms the API server; the operator
is started once for 2 and once for 3.

    .venv/bin/python bench/bench_create.py [--jobs 200]
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from bench_operator import REPO, create_all, grpojobs  # bench/ is the script's directory
from kubernetes import config

from grpo_testbed.launcher import Testbed, running_testbed
from grpo_testbed.nodes import bulk_cpu_nodes
from grpo_testbed.operator_process import OPERATOR_NS_PREFIX, OperatorProcess
from grpo_testbed.processes import wait_until

WEBHOOK_KINDS = ("validatingwebhookconfiguration", "mutatingwebhookconfiguration")


def burst(tb: Testbed, ns: str, n: int) -> float:
    """Seconds to create n GRPOJobs in a new namespace ns."""
    tb.kubectl("create", "namespace", ns)
    docs = grpojobs(n)
    for i, doc in enumerate(docs):
        doc["metadata"] = {"name": f"job-{i}", "namespace": ns}
    return create_all(docs, "grpo.dev", "v1alpha1", "grpojobs")


def with_operator(tb: Testbed, watched: tuple[str, ...], ns: str, n: int) -> float:
    """A burst while an operator (its webhooks managed) watches `watched`."""
    op = OperatorProcess(tb, Path(tempfile.mkdtemp(prefix="bench-op-")),
                         namespaces=watched).start()
    try:
        time.sleep(3)  # the webhook configurations written and served
        return burst(tb, ns, n)
    finally:
        op.stop()
        for kind in WEBHOOK_KINDS:
            tb.kubectl("delete", kind, "grpo.dev", "--ignore-not-found", check=False)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=200)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # "pool is full" at 16 threads
    load_before = os.getloadavg()[0]
    took: dict[str, float] = {}
    with running_testbed() as tb:
        config.load_kube_config(str(tb.kubeconfig))
        tb.apply(bulk_cpu_nodes(8))
        crd: Any = yaml.safe_load((REPO / "crds" / "grpojob.yaml").read_text())
        tb.apply(crd, server_side=True)
        wait_until("the GRPOJob CRD established", lambda: tb.kubectl(
            "wait", "--for", "condition=established", "--timeout", "10s",
            "crd/grpojobs.grpo.dev", check=False).returncode == 0, 60)
        # The first creates of a new CRD pay once for the API server's validators and
        # caches (2.7 s for the baseline's 200 when timed first, 0.7 s after this).
        burst(tb, "warm-up", 20)
        took["the CRD alone (baseline)"] = burst(tb, "plain", args.jobs)
        took["through the webhooks, no reconcile"] = with_operator(
            tb, ("elsewhere",), "hooked", args.jobs)
        ns = f"{OPERATOR_NS_PREFIX}-create"
        took["through the webhooks, reconciled"] = with_operator(
            tb, (f"{OPERATOR_NS_PREFIX}-*",), ns, args.jobs)
    base = took["the CRD alone (baseline)"]
    print(f"\n{args.jobs} GRPOJobs created at once (16 clients); seconds and ratio to the CRD "
          "alone")
    for what, seconds in took.items():
        print(f"  {what:40} {seconds:6.2f} s  {seconds / base:5.2f}x")
    print(f"load average before / after: {load_before:.2f} / {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
