"""GRPO step throughput: this trainer vs TRL's GRPOTrainer, same model and workload, one run.

Both sides get the same tiny Qwen2 (random weights, built here), or with ``--vision`` the
same tiny Qwen2.5-VL and one image per prompt (bench_trl_vision.py), the same prompts,
group size, response length, optimizer (AdamW, one step per prompts x n samples)
and fp32 on the CPU; neither uses a reference model. Each side's step time is the
wall clock between the ends of consecutive steps, after warm-up steps, and tokens
are each sample's prompt + completion tokens; ``update_tokens`` are what each side's
update forwards processed per step (padding included: ours the metric
``update/forward_tokens``, TRL's the input ids of its model's log-prob forwards). TRL
runs at every combination of ``--trl-threads`` and ``--trl-micro-batch``; the fastest is
the baseline. Usage:

    .venv/bin/python bench/bench_trl.py [--vision] [--steps 6 --warmup 2 --rounds 3 ...]

Prints one JSON line per side and round, then medians and the ratio (ours / TRL);
exits 1 if TRL is missing (install the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from math import nan
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
        "--trl-micro-batch",
        default="8,32",
        help="TRL's per_device_train_batch_size (samples per forward/backward) at each "
        "thread count; gradient accumulation makes up one optimizer step per prompts x n "
        "samples. Every combination runs; the fastest is the baseline",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=3,
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
    p.add_argument(
        "--trl-vllm",
        action="store_true",
        help="also try TRL with its vLLM colocate mode (use_vllm, vllm_mode=colocate) at "
        "every thread/micro-batch combination; if it cannot run here, its error is "
        "printed and recorded and the other TRL settings stay the baseline",
    )
    p.add_argument("--only", choices=["ours", "trl"], default=None)
    p.add_argument("--vision", action="store_true",
                   help="the tiny Qwen2.5-VL and one image per prompt on both sides")
    p.add_argument("--image-size", type=int, default=336,
                   help="--vision: the images' side in pixels (336: 144 image tokens)")
    p.add_argument("--profile", metavar="DIR", default=None,
                   help="py-spy our ranks into DIR (collapsed stacks, one file per rank)")
    p.add_argument("--compare-padded", action="store_true",
                   help="also run ours with actor.shared_prefix=false (the padded layout: "
                   "each group's prompt and image once per response), as side ours-padded")
    p.add_argument("--compare-dense", action="store_true",
                   help="also run ours with actor.segment_attention=false (the packed rows "
                   "under one dense 4-D mask), as side ours-dense")
    return p.parse_args()


Stamp = tuple[float, float]  # (wall clock, CPU seconds of the side's processes)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of these processes (all their threads)."""
    import psutil

    return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in pids)


def per_step(start: Stamp, stamps: list[Stamp], warmup: int) -> tuple[float, float]:
    """Mean wall seconds and CPU seconds per step after the warm-up steps."""
    pairs = list(itertools.pairwise([start, *stamps]))[warmup:]
    wall = statistics.fmean(b[0] - a[0] for a, b in pairs)
    return wall, statistics.fmean(b[1] - a[1] for a, b in pairs)


def build_workload(tmp: Path, args: argparse.Namespace) -> tuple[Path, Path, list[Any]]:
    """The model, our data file, and TRL's rows (problems; with --vision, with images)."""
    if args.vision:
        import bench_trl_vision

        return bench_trl_vision.build_workload(tmp, args)
    from grpo_testkit.datasets import write_text_task
    from grpo_testkit.tiny_models import build_tiny_qwen2

    model = build_tiny_qwen2(tmp / "model", hidden=args.hidden, layers=args.layers)
    data = write_text_task(tmp / "prompts.jsonl", rows=max(64, args.prompts * 4))
    problems = [json.loads(line)["problem"] for line in data.read_text().splitlines()]
    return model, data, problems


def bench_ours(model: Path, data: Path, args: argparse.Namespace,
               overrides: tuple[str, ...] = ()) -> dict[str, Any]:
    from grpo_trainer.cluster.ray_bootstrap import init_ray
    from grpo_trainer.config import build_config
    from grpo_trainer.driver.driver import GRPOTrainer
    from grpo_trainer.driver.metrics import MetricsLogger

    cfg = build_config(
        {
            "model": {"path": str(model)},
            "data": {"train_files": [str(data)]},
            "rollout": {"n": args.n, "max_new_tokens": args.max_new_tokens},
            "actor": {
                "lr": 1e-6,
                "dtype": "float32",
                "micro_batch_size": args.prompts * args.n // args.ranks,
                # gloo: keep gathered parameters until backward (docs/trainer.md).
                "reshard_after_forward": False,
            },
            "reward": {
                "type": "function",
                "function": "grpo_trainer.rewards.mentions:mentions_answer",
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
        [*args.overrides, *overrides],
        environ={},
    )
    stamps: list[Stamp] = []
    pids: list[int] = [os.getpid()]  # the driver, then the rank processes

    class Stamped(MetricsLogger):
        """Wall clock at the end of each step, as the TRL side's callback takes it."""

        def log(self, step: int, metrics: Any) -> None:
            super().log(step, metrics)
            stamps.append((time.perf_counter(), cpu_seconds(pids)))

    init_ray(cfg)
    trainer = GRPOTrainer(cfg, metrics=Stamped(cfg.metrics, cfg.trainer.total_steps))
    spies: list[Any] = []
    try:
        trainer.start()
        import ray

        assert trainer.group is not None
        pids += ray.get(
            [w.__ray_call__.remote(lambda _: os.getpid()) for w in trainer.group.workers]
        )
        if args.profile:
            spies = profile_ranks(pids[1:], args.profile, overrides)
        start = (time.perf_counter(), cpu_seconds(pids))
        history = trainer.run()
    finally:
        for spy in spies:  # py-spy writes its file when interrupted
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
        trainer.close()
        import ray

        ray.shutdown()
    timed = history[args.warmup :]
    step_s, cpu_s = per_step(start, stamps, args.warmup)
    tokens = statistics.fmean(m["throughput/tokens_per_s"] * m["time/step_s"] for m in timed)
    return {
        "side": "ours",
        "step_s": step_s,
        "cpu_s_per_step": cpu_s,
        "samples_per_s": args.prompts * args.n / step_s,
        "tokens_per_s": tokens / step_s,
        "completion_len": statistics.fmean(m["response/length_mean"] for m in timed),
        "rollout_s": statistics.fmean(m["time/rollout_s"] for m in timed),
        "update_s": statistics.fmean(m["time/update_s"] for m in timed),
        # (A trainer without these metrics, e.g. an older branch's: nan.)
        "update_tokens": statistics.fmean(m.get("update/forward_tokens", nan) for m in timed),
        "rank_tokens_spread": statistics.fmean(m.get("update/rank_tokens_spread", nan)
                                               for m in timed),
    }


def profile_ranks(pids: list[int], out: str, overrides: tuple[str, ...]) -> list[Any]:
    """py-spy sampling each rank (every step, warm-up included) into ``out``: collapsed
    stacks, one file per rank and side (``--format raw``: ``frame;frame;... count``)."""
    import shutil
    import subprocess

    # The bench extra installs py-spy beside this interpreter, which need not be on PATH.
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise SystemExit("--profile needs py-spy: install the bench extra (uv pip install "
                         "-e '.[bench]') or py-spy itself")
    Path(out).mkdir(parents=True, exist_ok=True)
    side = "padded" if overrides else "ours"
    return [subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "50",
                              "--format", "raw", "-o", f"{out}/{side}-rank{r}.txt"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for r, pid in enumerate(pids)]


def bench_trl(
    model: Path,
    problems: list[Any],
    args: argparse.Namespace,
    threads: int,
    micro: int,
    use_vllm: bool = False,
) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from grpo_trainer.rewards.mentions import mentions_answer

    torch.set_num_threads(threads)
    stamps: list[Stamp] = []
    me = [os.getpid()]
    update_tokens = [0]  # input ids of the log-prob forwards (TRL passes them labels)
    per_step_update: list[int] = []

    class Stamper(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, *a: Any, **k: Any) -> None:
            stamps.append((time.perf_counter(), cpu_seconds(me)))
            per_step_update.append(update_tokens[0])
            update_tokens[0] = 0

    def count(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        if "labels" in kwargs and "input_ids" in kwargs:
            update_tokens[0] += int(kwargs["input_ids"].numel())

    def reward(completions: list[Any], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [mentions_answer(t, "7")["overall"] for t in texts]

    if args.vision:
        import bench_trl_vision

        ds = bench_trl_vision.trl_dataset(problems)
    else:
        ds = Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in problems])
    with tempfile.TemporaryDirectory() as out:
        cfg = GRPOConfig(
            output_dir=out,
            use_cpu=True,
            bf16=False,
            learning_rate=1e-6,
            num_generations=args.n,
            max_completion_length=args.max_new_tokens,
            per_device_train_batch_size=micro,
            gradient_accumulation_steps=args.prompts * args.n // micro,
            max_steps=args.warmup + args.steps,
            beta=0.0,
            temperature=1.0,
            top_k=0,
            logging_steps=1,
            report_to="none",
            save_strategy="no",
            disable_dropout=True,
            dataloader_num_workers=0,
            **(
                {"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": False}
                if use_vllm
                else {}
            ),
        )
        # A VLM takes the processor, which TRL loads itself (left padding).
        tok = None if args.vision else AutoTokenizer.from_pretrained(model)
        trainer = GRPOTrainer(
            model=str(model),
            reward_funcs=reward,
            args=cfg,
            train_dataset=ds,
            processing_class=tok,
            callbacks=[Stamper()],
        )
        trainer.model.register_forward_pre_hook(count, with_kwargs=True)
        start = (time.perf_counter(), cpu_seconds(me))
        trainer.train()
        logs = [h for h in trainer.state.log_history if "num_tokens" in h]
    step_s, cpu_s = per_step(start, stamps, args.warmup)
    tok_counts = [h["num_tokens"] for h in logs]
    per_step_tokens = [b - a for a, b in itertools.pairwise(tok_counts)]
    tokens = statistics.fmean(per_step_tokens[args.warmup - 1 :]) if per_step_tokens else 0.0
    return {
        "side": f"trl{'-vllm' if use_vllm else ''}@{threads}t/mb{micro}",
        "step_s": step_s,
        "cpu_s_per_step": cpu_s,
        "samples_per_s": args.prompts * args.n / step_s,
        "tokens_per_s": tokens / step_s,
        "completion_len": statistics.fmean(
            h["completions/mean_length"] for h in logs[args.warmup :]
        ),
        "update_tokens": statistics.fmean(per_step_update[args.warmup :]),
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
    if args.compare_padded and args.only != "trl":
        sides.append("ours-padded")
    if args.compare_dense and args.only != "trl":
        sides.append("ours-dense")
    if args.only != "ours":
        micros = [int(m) for m in args.trl_micro_batch.split(",") if m]
        sides += [f"trl@{t}t/mb{m}" for t in trl_threads for m in micros]
        if args.trl_vllm:
            sides += [f"trl-vllm@{t}t/mb{m}" for t in trl_threads for m in micros]
    errors: dict[str, str] = {}
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    with tempfile.TemporaryDirectory() as tmp:
        model, data, problems = build_workload(Path(tmp), args)
        for rnd in range(args.rounds):
            for side in sides:
                if side in errors:
                    continue
                if side == "ours":
                    res = bench_ours(model, data, args)
                elif side == "ours-padded":
                    res = bench_ours(model, data, args, ("actor.shared_prefix=false",))
                    res["side"] = side
                elif side == "ours-dense":
                    res = bench_ours(model, data, args, ("actor.segment_attention=false",))
                    res["side"] = side
                else:
                    kind, setting = side.split("@")
                    threads, micro = setting.split("t/mb")
                    try:
                        res = bench_trl(
                            model, problems, args, int(threads), int(micro), kind == "trl-vllm"
                        )
                    except Exception as err:  # TRL's vLLM mode may not run on a CPU
                        errors[side] = f"{type(err).__name__}: {err}"[:500]
                        print(json.dumps({"side": side, "error": errors[side]}), flush=True)
                        continue
                    res["trl_version"] = trl.__version__
                res["round"] = rnd
                res["load_avg_1m"] = os.getloadavg()[0]
                runs[side].append(res)
                print(json.dumps(res), flush=True)
    summary: dict[str, Any] = {"config": vars(args), "errors": errors}
    runs = {side: results for side, results in runs.items() if results}
    for side, results in runs.items():
        step_s = statistics.median(r["step_s"] for r in results)
        tokens = statistics.median(r["tokens_per_s"] * r["step_s"] for r in results)
        summary[side] = {
            "step_s": step_s,
            "samples_per_s": args.prompts * args.n / step_s,
            "tokens_per_s": tokens / step_s,
            "cpu_s_per_step": statistics.median(r["cpu_s_per_step"] for r in results),
            "update_tokens": statistics.median(r["update_tokens"] for r in results),
            "load_avg_1m": [round(r["load_avg_1m"], 2) for r in results],
        }
    trl_sides = [s for s in runs if s.startswith("trl")]
    if "ours" in runs and trl_sides:
        best = max(trl_sides, key=lambda s: summary[s]["samples_per_s"])
        summary["baseline"] = best
        for unit in ("samples_per_s", "tokens_per_s"):
            summary[f"ratio_{unit}"] = summary["ours"][unit] / summary[best][unit]
        # Each round against the fastest TRL run of the same round (similar load).
        per_round = [
            runs["ours"][i]["samples_per_s"] / max(runs[s][i]["samples_per_s"] for s in trl_sides)
            for i in range(args.rounds)
        ]
        summary["ratio_samples_per_s_by_round"] = per_round
        summary["ratio_samples_per_s_median_of_rounds"] = statistics.median(per_round)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
