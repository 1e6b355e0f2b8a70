"""Disaggregated, one-step-off rollouts against colocated ones: the simulated step time
of each split R:T of a fixed number of nodes, and the best split, checked against the
planner's proposal for the same job.

Simulated, not measured: the step's work comes from EasyR1's published Qwen2.5-VL-7B
step (v0.3.0 assets/baselines.md: 8 x H100 80GB, 180 s per step, 1200 tokens/s/GPU)
and the assumptions stated in grpo_operator/planner/split.py (generation 50% of the
step, a 30% generation tail, the sync 1.2%), imported from there (one copy).

    colocated:      step = generation on all GPUs (tail included) + update on all + sync
    1-step-off:     step = max(generation on R GPUs, update on T GPUs) + sync
    synchronous:    step = generation on R + update on T + sync   (maxStaleness 0)

    .venv/bin/python bench/bench_async_split.py [--nodes 4] [--gpus-per-node 8]
"""

from __future__ import annotations

import argparse
import copy
import os
from typing import Any

import yaml

from grpo_api.job import parse_spec
from grpo_operator.planner import plan_memory
from grpo_operator.planner.disaggregated import spec_work
from grpo_operator.planner.split import (
    GENERATION_SHARE,
    REFERENCE_STEP_S,
    TAIL_SHARE,
    WEIGHT_SYNC_SHARE,
    splits,
)
from grpo_testbed.examples import EXAMPLES

EXAMPLE = "grpojob-qwen25vl-7b-h100.yaml"  # EasyR1's geometry: 512 x 5 x (2048 + 2048)


def _spec(nodes: int, gpus_per_node: int) -> dict[str, Any]:
    doc = yaml.safe_load((EXAMPLES / EXAMPLE).read_text())
    spec: dict[str, Any] = copy.deepcopy(doc["spec"])
    spec["resources"] |= {"nodes": nodes, "gpusPerNode": gpus_per_node}
    spec["rollout"] = {"placement": "disaggregated", "disaggregated": {}}
    return spec


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--gpus-per-node", type=int, default=8)
    args = ap.parse_args()
    spec = parse_spec(_spec(args.nodes, args.gpus_per_node))
    d = spec.data
    tokens = spec.training.rollout_batch_size * spec.algorithm.rollout_n * (
        d.max_prompt_length + d.max_response_length)
    plan = plan_memory(spec)
    work = spec_work(spec, plan.geometry.shape)  # what the planner splits by
    gpn = args.gpus_per_node
    total = args.nodes * gpn
    colocated = work.colocated_s(total)
    print(f"Qwen2.5-VL-7B, {tokens} step tokens (at max lengths), {args.nodes} x {gpn} "
          f"H100; reference {REFERENCE_STEP_S:.0f} s / step on 8 GPUs; generation "
          f"{GENERATION_SHARE:.0%} (tail {TAIL_SHARE:.0%} of it), sync "
          f"{WEIGHT_SYNC_SHARE:.1%}; load average {os.getloadavg()[0]:.2f}")
    print(f"work: generation {work.generation_gpu_s:.1f} GPU-s + tail {work.tail_s:.1f} s, "
          f"update {work.update_gpu_s:.1f} GPU-s, sync {work.sync_s:.2f} s")
    print(f"\n{'R:T (GPUs)':>12} {'gen s':>7} {'update s':>9} {'1-off s':>8} {'x colo':>7} "
          f"{'sync s':>7} {'x colo':>7}")
    print(f"{'colocated':>12} {work.generation_s(total):7.1f} "
          f"{work.update_gpu_s / total:9.1f} {colocated:8.1f} {1.0:7.2f}")
    overlapped = {s.rollout_nodes: s for s in splits(args.nodes, gpn, work, overlap=True)}
    in_turn = {s.rollout_nodes: s for s in splits(args.nodes, gpn, work, overlap=False)}
    # Every rank updates on the same number of samples: a training side whose ranks do
    # not divide globalBatchSize is refused (the planner skips it; memory fits here).
    batch = spec.training.global_batch_size
    for r in sorted(overlapped):
        s, t = overlapped[r], in_turn[r]
        mark = "" if batch % (s.train_nodes * gpn) == 0 else f"  (T does not divide {batch})"
        print(f"{f'{r * gpn}:{s.train_nodes * gpn}':>12} {s.generation_s:7.1f} "
              f"{s.update_s:9.1f} {s.step_s:8.1f} {s.speedup:7.2f} {t.step_s:7.1f} "
              f"{t.speedup:7.2f}{mark}")
    rank = sorted(overlapped.values(), key=lambda s: (round(s.step_s, 6), s.rollout_nodes))
    best = rank[0]
    runnable = next(s for s in rank if batch % (s.train_nodes * gpn) == 0)
    assert plan.geometry.rollout is not None
    proposed = plan.geometry.rollout.nodes
    print(f"\nbest 1-step-off split: {best.rollout_nodes * gpn} rollout : "
          f"{best.train_nodes * gpn} training GPUs, {best.step_s:.1f} s / step, "
          f"x{best.speedup:.2f} over colocated")
    if runnable is not best:
        print(f"best that can run: {runnable.rollout_nodes * gpn} : "
              f"{runnable.train_nodes * gpn}, {runnable.step_s:.1f} s, "
              f"x{runnable.speedup:.2f}")
    agrees = proposed == runnable.rollout_nodes
    print(f"planner's proposal: {proposed} of {args.nodes} nodes generate "
          f"({'agrees' if agrees else 'DIFFERS'})")
    return 0 if agrees else 1


if __name__ == "__main__":
    raise SystemExit(main())
