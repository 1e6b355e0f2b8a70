"""GRPO step throughput: this trainer vs TRL's GRPOTrainer, same model and workload, one run.

Both sides get the same tiny Qwen2 (random weights, built here), the same prompts,
group size, response length, optimizer and fp32 on the CPU; neither uses a
reference model. Each measures wall time per optimizer step after warm-up steps,
and counts the prompt + completion tokens it actually processed. Usage:

    .venv/bin/python bench/bench_trl.py [--steps 6 --warmup 2 --ranks 1 ...]

Prints one JSON line per side and the ratio (ours / TRL); exits 1 if TRL is
missing (install the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6, help="timed optimizer steps")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    p.add_argument("--prompts", type=int, default=4, help="prompts per step")
    p.add_argument("--n", type=int, default=8, help="generations per prompt")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--ranks", type=int, default=os.cpu_count() or 1, help="our FSDP ranks")
    p.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="CPU threads for our side (split over ranks)",
    )
    p.add_argument(
        "--trl-threads",
        default=f"1,{os.cpu_count() or 1}",
        help="TRL is run at each of these torch thread counts; the fastest is "
        "the baseline (multi-threaded runs suffer most from background load)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="alternate ours/TRL this many times; medians over all rounds "
        "(a shared machine's background load then hits both sides alike)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY.PATH=VALUE",
        help="extra config overrides for our side",
    )
    p.add_argument("--only", choices=["ours", "trl"], default=None)
    return p.parse_args()


def build_workload(tmp: Path, args: argparse.Namespace) -> tuple[Path, Path, list[str]]:
    from grpo_trainer.testing.datasets import write_text_task
    from grpo_trainer.testing.tiny_models import build_tiny_qwen2

    model = build_tiny_qwen2(tmp / "model", hidden=args.hidden, layers=args.layers)
    data = write_text_task(tmp / "prompts.jsonl", rows=max(64, args.prompts * 4))
    problems = [json.loads(line)["problem"] for line in data.read_text().splitlines()]
    return model, data, problems


def bench_ours(model: Path, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    from grpo_trainer.config import build_config
    from grpo_trainer.driver import GRPOTrainer, init_ray

    cfg = build_config(
        {
            "model": {"path": str(model)},
            "data": {"train_files": [str(data)]},
            "rollout": {"n": args.n, "max_new_tokens": args.max_new_tokens},
            "actor": {
                "lr": 1e-6,
                "dtype": "float32",
                "micro_batch_size": args.prompts * args.n // args.ranks,
            },
            "reward": {
                "type": "function",
                "function": "grpo_trainer.testing.rewards:target_token_reward",
            },
            "resources": {
                "num_workers": args.ranks,
                "cpus_per_worker": max(1, args.threads // args.ranks),
                "ray_address": "local",
            },
            "trainer": {
                "total_steps": args.warmup + args.steps,
                "rollout_batch_size": args.prompts,
            },
            "metrics": {"jsonl": False, "progress_bar": "off"},
        },
        args.overrides,
        environ={},
    )
    init_ray(cfg)
    trainer = GRPOTrainer(cfg)
    try:
        trainer.start()
        history = trainer.run()
    finally:
        trainer.close()
        import ray

        ray.shutdown()
    timed = history[args.warmup :]
    step_s = statistics.fmean(m["time/step_s"] for m in timed)
    tokens = statistics.fmean(m["throughput/tokens_per_s"] * m["time/step_s"] for m in timed)
    return {
        "side": "ours",
        "step_s": step_s,
        "samples_per_s": args.prompts * args.n / step_s,
        "tokens_per_s": tokens / step_s,
        "completion_len": statistics.fmean(m["response/length_mean"] for m in timed),
        "rollout_s": statistics.fmean(m["time/rollout_s"] for m in timed),
        "update_s": statistics.fmean(m["time/update_s"] for m in timed),
    }


def bench_trl(
    model: Path, problems: list[str], args: argparse.Namespace, threads: int
) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_trainer.testing.rewards import target_token_reward

    torch.set_num_threads(threads)
    stamps: list[float] = []

    class Stamp(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *a: Any, **k: Any) -> None:
            stamps.append(time.perf_counter())

    def reward(completions: list[Any], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [target_token_reward(t, "7")["overall"] for t in texts]

    ds = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in problems])
    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            learning_rate=1e-6,
            num_generations=args.n,
            max_completion_length=args.max_new_tokens,
            per_device_train_batch_size=args.n,
            gradient_accumulation_steps=args.prompts,
            max_steps=args.warmup + args.steps,
            beta=0.0,
            temperature=1.0,
            top_k=0,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_dropout=True,
            dataloader_num_workers=0,
        )
        tok = AutoTokenizer.from_pretrained(model)
        trainer = GRPOTrainer(
            model=str(model),
            reward_funcs=reward,
            args=cfg,
            train_dataset=ds,
            processing_class=tok,
            callbacks=[Stamp()],
        )
        start = time.perf_counter()
        trainer.train()
        logs = [h for h in trainer.state.log_history if "num_tokens" in h]
    edges = [start, *stamps]
    durations = [b - a for a, b in itertools.pairwise(edges)][args.warmup :]
    step_s = statistics.fmean(durations)
    tok_counts = [h["num_tokens"] for h in logs]
    per_step_tokens = [b - a for a, b in itertools.pairwise(tok_counts)]
    tokens = statistics.fmean(per_step_tokens[args.warmup - 1 :]) if per_step_tokens else 0.0
    return {
        "side": f"trl@{threads}t",
        "step_s": step_s,
        "samples_per_s": args.prompts * args.n / step_s,
        "tokens_per_s": tokens / step_s,
        "completion_len": statistics.fmean(
            h["completions/mean_length"] for h in logs[args.warmup :]
        ),
    }


def main() -> int:
    args = parse_args()
    try:
        import trl
    except ImportError:
        print("TRL is not installed: uv pip install -e '.[trainer,bench]'", file=sys.stderr)
        return 1
    trl_threads = [int(t) for t in args.trl_threads.split(",") if t]
    sides = ["ours"] if args.only != "trl" else []
    if args.only != "ours":
        sides += [f"trl@{t}t" for t in trl_threads]
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        model, data, problems = build_workload(Path(tmp), args)
        for rnd in range(args.rounds):
            for side in sides:
                if side == "ours":
                    res = bench_ours(model, data, args)
                else:
                    res = bench_trl(model, problems, args, int(side[4:-1]))
                    res["trl_version"] = trl.__version__
                res["round"] = rnd
                res["load_avg_1m"] = os.getloadavg()[0]
                runs[side].append(res)
                print(json.dumps(res), flush=True)
    summary: dict[str, Any] = {"config": vars(args)}
    for side, results in runs.items():
        step_s = statistics.median(r["step_s"] for r in results)
        tokens = statistics.median(r["tokens_per_s"] * r["step_s"] for r in results)
        summary[side] = {
            "step_s": step_s,
            "samples_per_s": args.prompts * args.n / step_s,
            "tokens_per_s": tokens / step_s,
        }
    trl_sides = [s for s in runs if s.startswith("trl")]
    if "ours" in runs and trl_sides:
        best = max(trl_sides, key=lambda s: summary[s]["samples_per_s"])
        summary["baseline"] = best
        for unit in ("samples_per_s", "tokens_per_s"):
            summary[f"ratio_{unit}"] = summary["ours"][unit] / summary[best][unit]
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
