"""What reduce-scattering every micro-batch costs against once per mini-batch.

The trainer reduce-scatters each micro-batch's gradients into the shards (``ours``):
the gradient stays a shard, as the planner counts it. The baseline (``sync-once``) is
what it did before: gradient sync off for every micro-batch but the last, which keeps
every parameter's whole float32 gradient on every rank until then. Both on 2 spawned
gloo ranks with real ``Worker`` updates of the tiny Qwen2 (random weights, built here),
float32 compute, ``--micro`` micro-batches of 2 samples per rank and optimizer step;
the rounds alternate the two so background load falls on both. The figure per side
is the median of the update's wall time (forward, backward, optimizer step; rank 0)
after a warm-up round.

    .venv/bin/python bench/bench_grad_sync.py [--micro 8 --rounds 9 --hidden 64 --layers 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--micro", type=int, default=8, help="micro-batches per optimizer step")
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--warmup", type=int, default=1, help="rounds run first and not timed")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    return p.parse_args()


def _sync_once(policy: Any, micros: int) -> None:
    """The old accumulation: gradient sync on for the last micro-batch only."""
    step = policy._micro_step
    count = [0]

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        policy.state.actor.set_requires_gradient_sync(count[0] % micros == micros - 1)
        count[0] += 1
        return step(*args, **kwargs)

    policy._micro_step = wrapped


def rank_times(rank: int, world: int, arg: dict[str, Any]) -> dict[str, list[float]]:
    from grpo_trainer.config import build_config
    from grpo_trainer.data import Record
    from grpo_trainer.rank.worker import Worker

    worker = Worker(build_config(arg["config"], environ={}), rank, world)
    worker.setup("127.0.0.1", 0)
    per_rank = 2 * arg["micro"]
    items = [(Record(rank, f"Say the number 7 please {rank}", "7"),
              [11 + (i + j) % 40 for j in range(12)]) for i in range(per_rank)]
    advantages = [1.0 if i % 2 else -1.0 for i in range(per_rank)]
    original = worker.policy._micro_step
    times: dict[str, list[float]] = {"ours": [], "sync-once": []}
    for round_ in range(arg["warmup"] + arg["rounds"]):
        for side in times:
            worker.policy._micro_step = original
            if side == "sync-once":
                _sync_once(worker.policy, arg["micro"])
            worker.load_samples(items)
            t0 = time.perf_counter()
            worker.update(advantages, step=1)
            if round_ >= arg["warmup"]:
                times[side].append(time.perf_counter() - t0)
    return times


def main() -> None:
    args = parse_args()
    from grpo_testkit.configs import text_config
    from grpo_testkit.datasets import write_text_task
    from grpo_testkit.dist import run_ranks
    from grpo_testkit.tiny_models import build_tiny_qwen2

    with tempfile.TemporaryDirectory() as tmp:
        model = build_tiny_qwen2(Path(tmp) / "m", hidden=args.hidden, layers=args.layers)
        data = write_text_task(Path(tmp) / "t.jsonl")
        config = text_config(
            model, data,
            actor={"micro_batch_size": 2, "dtype": "float32", "shared_prefix": False},
            rollout={"n": 2 * args.micro}, trainer={"rollout_batch_size": 2},
        )
        arg = {"config": config, "micro": args.micro, "rounds": args.rounds,
               "warmup": args.warmup}
        times = run_ranks(rank_times, 2, arg, timeout_s=1800)[0]
    ours, once = statistics.median(times["ours"]), statistics.median(times["sync-once"])
    print(json.dumps({"micro": args.micro, "hidden": args.hidden, "layers": args.layers,
                      "ours_s": round(ours, 4), "sync_once_s": round(once, 4),
                      "ratio": round(ours / once, 3), "rounds": times}))
    print(f"update with {args.micro} micro-batches: every micro-batch {ours:.3f} s, "
          f"once per mini-batch {once:.3f} s, ratio {ours / once:.2f}x")


if __name__ == "__main__":
    main()
