"""How fast a burst of claims binds on the testbed: kwok's volume stages (the baseline)
vs the testbed's provisioner (grpo_testbed/provisioner.py: an external-provisioner's
half, kube-controller-manager's PV controller binding for real). One testbed, both
classes, rounds alternating so that background load falls on both.

Per claim: seconds from just before its create call to a watch seeing it Bound.

    .venv/bin/python bench/bench_claims.py [--claims 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from bench_operator import pct  # bench/ is the script's directory
from kubernetes import client, config, watch

from grpo_testbed.launcher import running_testbed
from grpo_testbed.provisioner import STORAGE_CLASS, VolumeProvisioner, storage_class

KWOK_CLASS = "kwok-volume"
CREATORS = 8  # client threads creating the burst


def claim(name: str, storage_class_name: str) -> dict[str, Any]:
    # As the operator's checkpoint claims: ReadWriteMany, the spec's size.
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "labels": {"bench": "claims"}},
            "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": storage_class_name,
                     "resources": {"requests": {"storage": "100Gi"}}}}


def burst(core: client.CoreV1Api, ns: str, n: int, cls: str) -> list[float]:
    """Create ``n`` claims of class ``cls`` at once; each one's seconds to Bound."""
    started: dict[str, float] = {}
    bound: dict[str, float] = {}
    done = threading.Event()

    def watcher() -> None:
        w = watch.Watch()
        for event in w.stream(core.list_namespaced_persistent_volume_claim, ns,
                              timeout_seconds=600):
            pvc = event["object"]
            if pvc.status and pvc.status.phase == "Bound":
                bound.setdefault(pvc.metadata.name, time.monotonic())
                if len(bound) == n:
                    w.stop()
        done.set()

    t = threading.Thread(target=watcher, daemon=True)
    t.start()
    time.sleep(0.5)  # the watch is open before the first create

    def create(i: int) -> None:
        name = f"{cls}-{i}"
        started[name] = time.monotonic()
        core.create_namespaced_persistent_volume_claim(ns, cast(Any, claim(name, cls)))

    with ThreadPoolExecutor(CREATORS) as pool:
        list(pool.map(create, range(n)))
    if not done.wait(600):
        raise SystemExit(f"{cls}: only {len(bound)} of {n} claims bound in 600 s")
    return [bound[name] - started[name] for name in started]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--claims", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    results: dict[str, list[list[float]]] = {KWOK_CLASS: [], STORAGE_CLASS: []}
    with running_testbed(with_kuberay=False, with_kueue=False, with_registry=False) as tb:
        tb.apply([storage_class()])
        provisioner = VolumeProvisioner(tb.kubeconfig).start()
        api = config.new_client_from_config(config_file=str(tb.kubeconfig))
        core = client.CoreV1Api(api)
        try:
            for r in range(args.rounds):
                for cls in (KWOK_CLASS, STORAGE_CLASS) if r % 2 == 0 else (STORAGE_CLASS,
                                                                         KWOK_CLASS):
                    ns = tb.namespace(f"claims-{r}")
                    load = os.getloadavg()[0]
                    took = burst(core, ns, args.claims, cls)
                    results[cls].append(took)
                    print(f"round {r} {cls:15} p50 {pct(took, 0.5):6.2f} s  p99 "
                          f"{pct(took, 0.99):6.2f} s  max {max(took):6.2f} s  (load {load:.2f})",
                          flush=True)
        finally:
            provisioner.stop()
    print(f"\n{args.claims} claims created at once ({CREATORS} client threads), "
          f"median over {args.rounds} rounds of each round's percentile:")
    rows = {cls: {q: statistics.median(pct(t, q) for t in runs) for q in (0.5, 0.99)}
            for cls, runs in results.items()}
    for q, label in ((0.5, "p50"), (0.99, "p99")):
        base, ours = rows[KWOK_CLASS][q], rows[STORAGE_CLASS][q]
        print(f"Bound {label}: kwok stages {base:.2f} s, testbed provisioner {ours:.2f} s "
              f"({ours / base:.2f}x)")


if __name__ == "__main__":
    main()
