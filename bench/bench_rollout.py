"""Rollout throughput: vLLM (CPU backend) against the trainer's transformers engine.

Same model (a random-weight Qwen2 built here), same prompts, group size, response
length (EOS suppressed, so every sample generates exactly --max-new-tokens), float32,
one process with --threads torch threads each side. The baseline is
``HFGenerateEngine`` (its lean KV-cached sampler, the CPU engine the trainer uses);
each round times one ``generate`` of every prompt x n on both engines, alternating, so
background load hits both alike. Usage:

    .venv/bin/python bench/bench_rollout.py [--rounds 5 --prompts 8 --n 8 ...]

Prints one JSON line per engine and round, then the medians and the ratio vLLM / HF.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    return p.parse_args()


def build(tmp: Path, args: argparse.Namespace) -> tuple[Path, list[Any], Any]:
    from transformers import AutoTokenizer

    from grpo_testkit.tiny_models import build_tiny_qwen2
    from grpo_trainer.algorithm.samples import PromptEncoder
    from grpo_trainer.data import Record, load_template

    model = build_tiny_qwen2(tmp / "model", hidden=args.hidden, layers=args.layers)
    tok = AutoTokenizer.from_pretrained(model)
    enc = PromptEncoder(None, tok, load_template("plain"), None)
    prompts = [
        enc.encode(Record(i, f"What is {i} plus {i + 3}? Think step by step.", "", []))
        for i in range(args.prompts)
    ]
    return model, prompts, tok


def main() -> None:
    args = parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    import torch
    from transformers import AutoModelForCausalLM

    from grpo_trainer.rollout.base import SamplingSpec
    from grpo_trainer.rollout.hf import HFGenerateEngine
    from grpo_trainer.rollout.vllm_engine import VLLMEngine, VLLMEngineConfig, kv_cache_bytes

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        model_path, prompts, tok = build(Path(tmp), args)
        hf_model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
        eos = int(tok.convert_tokens_to_ids("<|im_end|>"))
        hf = HFGenerateEngine(hf_model, int(tok.pad_token_id), [eos])
        max_len = max(p.input_ids.numel() for p in prompts) + args.max_new_tokens + 8
        seqs = args.prompts * args.n
        t0 = time.perf_counter()
        vllm = VLLMEngine(
            VLLMEngineConfig(
                model_path=str(model_path),
                dtype="float32",
                tensor_parallel_size=1,
                max_model_len=max_len,
                max_num_seqs=seqs,
                gpu_memory_utilization=0.5,
                cpu_kv_cache_bytes=kv_cache_bytes(
                    hf_model.config, torch.float32, seqs * max_len, 1
                ),
                seed=0,
                enable_sleep_mode=True,
            )
        )
        print(json.dumps({"vllm_start_s": round(time.perf_counter() - t0, 1)}), flush=True)
        # Every sample runs to max_new_tokens on both sides: equal work per round.
        spec = SamplingSpec(
            n=args.n,
            temperature=1.0,
            top_p=1.0,
            max_new_tokens=args.max_new_tokens,
            seed=0,
            suppress_ids=(eos, int(tok.pad_token_id)),
            prompt_seeds=tuple(range(args.prompts)),
        )
        engines: dict[str, Any] = {"hf": hf, "vllm": vllm}
        rates: dict[str, list[float]] = {"hf": [], "vllm": []}
        warm = dataclasses.replace(spec, prompt_seeds=spec.prompt_seeds[:1])
        for name in engines:  # warm-up: first calls pay one-off costs
            engines[name].generate(prompts[:1], warm)
        for r in range(args.rounds):
            for name, engine in engines.items():
                t = time.perf_counter()
                out = engine.generate(prompts, spec)
                dt = time.perf_counter() - t
                tokens = sum(int(g.token_ids.numel()) for group in out for g in group)
                rates[name].append(tokens / dt)
                print(
                    json.dumps(
                        {
                            "round": r,
                            "engine": name,
                            "tokens": tokens,
                            "seconds": round(dt, 3),
                            "tokens_per_s": round(tokens / dt, 1),
                        }
                    ),
                    flush=True,
                )
        med = {k: statistics.median(v) for k, v in rates.items()}
        print(
            json.dumps(
                {
                    "median_tokens_per_s": {k: round(v, 1) for k, v in med.items()},
                    "ratio_vllm_over_hf": round(med["vllm"] / med["hf"], 2),
                    "load_average": os.getloadavg(),
                    "workload": vars(args),
                }
            )
        )


if __name__ == "__main__":
    main()
