"""The update's log-probs: the chunked head against the full logits, in the same run.

One micro-batch's forward and backward of the GRPO update's log-prob loss (log-probs
with the entropy as a metric, as ``PolicyUpdate`` computes them) on a Qwen2 with Qwen's
vocabulary (151936 entries, the ratio's driver) and a small decoder, random weights
built here, both ways: ``full`` (``lean_logprobs.full_logits_log_probs``: the whole
sequence's logits, a float32 copy, log-softmax and entropy over all of it, as the trainer
did before) and ``chunked`` (``lean_log_probs``: the response positions only,
``--chunk`` tokens at a time, recomputed in backward). Per case and side:

- peak bytes: the most bytes of tensors the step had made and not yet freed
  (``memory_census.LiveBytes``, every storage an operation creates, counted until it is
  freed; weights and inputs are not in it);
- time: the median wall time of ``--repeats`` steps without that accounting, the sides
  alternating so background load falls on both.

A case is ``prompt:response`` tokens per sample, ``--micro-batch`` samples. The default
cases: prompt = response (the shape the H100 measured) and a prompt 4x the response (an
image-heavy prompt: its image tokens cost the full logits as much as text).

    .venv/bin/python bench/bench_logprobs.py [--cases 256:256,1024:256 --micro-batch 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

QWEN_VOCAB = 151936


def parse_args() -> argparse.Namespace:
    from grpo_api.trainer_config import LOGPROB_CHUNK_TOKENS

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cases", default="256:256,1024:256", help="prompt:response,...")
    p.add_argument("--micro-batch", type=int, default=1)
    p.add_argument("--chunk", type=int, default=LOGPROB_CHUNK_TOKENS)
    p.add_argument("--vocab", type=int, default=QWEN_VOCAB)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16",
                   help="the model's (compute) dtype; the log-softmax is float32 either way")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    return p.parse_args()


def _model(args: argparse.Namespace) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=args.vocab, hidden_size=args.hidden,
                      intermediate_size=4 * args.hidden, num_hidden_layers=args.layers,
                      num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=8192, tie_word_embeddings=False)
    return Qwen2ForCausalLM(cfg).to(getattr(torch, args.dtype)).train()


def _batch(prompt: int, response: int, samples: int, vocab: int) -> Any:
    from grpo_trainer.algorithm.samples import EncodedPrompt, Sample, collate_train
    from grpo_trainer.data import Record

    gen = torch.Generator().manual_seed(prompt + response)
    items = []
    for i in range(samples):  # a prompt each: the padded layout, as an image batch takes
        p = EncodedPrompt(Record(i, "", ""), torch.randint(10, vocab, (prompt,), generator=gen))
        items.append(Sample(p, torch.randint(10, vocab, (response,), generator=gen),
                            torch.zeros(response), True))
    return collate_train(items, 0)


def _step(model: torch.nn.Module, batch: Any, chunked: bool, chunk: int) -> None:
    from grpo_trainer.algorithm.lean_logprobs import full_logits_log_probs, lean_log_probs

    kwargs: dict[str, Any] = {"temperature": 1.0, "entropy": True, "entropy_grad": False}
    inputs = batch.model_inputs
    out = (lean_log_probs(model, inputs, batch, chunk=chunk, **kwargs) if chunked
           else full_logits_log_probs(model, inputs, batch, **kwargs))
    (out.logp * batch.response_mask).sum().backward()
    model.zero_grad(set_to_none=True)


def _peak(model: torch.nn.Module, batch: Any, chunked: bool, chunk: int) -> int:
    from grpo_testkit.memory_census import LiveBytes

    with LiveBytes() as live:
        _step(model, batch, chunked, chunk)
    return live.peak


def run_case(args: argparse.Namespace, model: torch.nn.Module, prompt: int, response: int
             ) -> dict[str, Any]:
    batch = _batch(prompt, response, args.micro_batch, args.vocab)
    sides = {"full": False, "chunked": True}
    out: dict[str, Any] = {"prompt": prompt, "response": response}
    for name, chunked in sides.items():
        out[name] = {"peak_bytes": _peak(model, batch, chunked, args.chunk), "seconds": []}
    for _ in range(args.repeats):
        for name, chunked in sides.items():
            t0 = time.perf_counter()
            _step(model, batch, chunked, args.chunk)
            out[name]["seconds"].append(time.perf_counter() - t0)
    for name in sides:
        out[name]["median_s"] = statistics.median(out[name]["seconds"])
    out["peak_ratio"] = out["full"]["peak_bytes"] / out["chunked"]["peak_bytes"]
    out["time_ratio"] = out["chunked"]["median_s"] / out["full"]["median_s"]
    tokens = args.micro_batch * response
    out["full_bytes_per_response_token_per_vocab"] = (
        out["full"]["peak_bytes"] / (tokens * args.vocab))
    return out


def main() -> None:
    import os
    import platform

    args = parse_args()
    torch.set_num_threads(os.cpu_count() or 1)
    model = _model(args)
    cases = [tuple(int(x) for x in c.split(":")) for c in args.cases.split(",") if c]
    report: dict[str, Any] = {
        "args": vars(args) | {"out": str(args.out)},
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor(),
                    "load_average_before": os.getloadavg(), "torch": torch.__version__},
        "cases": [],
    }
    print(f"{'prompt':>7} {'resp':>5} | {'full peak MiB':>13} {'chunked MiB':>11} {'ratio':>6} | "
          f"{'full s':>7} {'chunked s':>9} {'time x':>6} | full B/tok/V")
    for prompt, response in cases:
        r = run_case(args, model, prompt, response)
        report["cases"].append(r)
        print(f"{prompt:>7} {response:>5} | {r['full']['peak_bytes'] / 2**20:>13.1f} "
              f"{r['chunked']['peak_bytes'] / 2**20:>11.1f} {r['peak_ratio']:>6.1f} | "
              f"{r['full']['median_s']:>7.2f} {r['chunked']['median_s']:>9.2f} "
              f"{r['time_ratio']:>6.2f} | {r['full_bytes_per_response_token_per_vocab']:.1f}",
              flush=True)
    report["machine"]["load_average_after"] = os.getloadavg()
    if args.out:
        args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
