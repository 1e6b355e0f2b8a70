"""bf16 training (``actor.precision: bf16``) against mixed precision, on the tiny tasks.

Modes, all computing in float32 so that only the storage and the update differ:
``mixed`` (float32 weights, gradients and AdamW state: the reference), and bf16
weights, gradients and moments with the update ``kahan`` (compensation buffer, what
the trainer uses), ``stochastic`` (stochastic rounding of the weights) and ``none``
(plain bf16 AdamW). Two measurements per task (tiny Qwen2 text task, tiny Qwen2.5-VL
vision task), one rank in this process (no Ray):

Every mode starts from the same weights (the tiny models' random weights rounded to
bf16, as a checkpoint published in bf16 would be).

* drift: the same fixed batches (random responses, random advantages) for ``--drift-steps``
  optimizer steps at each ``--drift-lr``; reported as ||w_mode - w_mixed|| / ||w_mixed -
  w_0||, the error relative to how far the reference moved, for the values the
  optimizer holds (``held``: weight + compensation) and the bf16 weights the forward
  pass sees (``weights``: at best the reference rounded to bf16).
* learning: the real GRPO loop for ``--steps`` steps at the task's learning rate; the
  mean reward of the first and the last 4 steps, and the update time per step.

And one without a model: the optimizer alone on 20k weights of LLM scale (std 0.02) for
``--long-steps`` steps at lr 1e-5, the gradients dropping 10x halfway, against a float64
AdamW on the same bf16 gradients; here also ``kahan-nearest-v`` (the second moment
rounded to nearest instead of stochastically).

    .venv/bin/python bench/bench_bf16.py [--steps 16 --drift-steps 20 --drift-lr 1e-2,1e-5]

Prints one JSON line per measurement, then a table per task.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from grpo_trainer.rank.worker import Worker

MODES = ("mixed", "kahan", "stochastic", "none")


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=16, help="GRPO steps of the learning run")
    p.add_argument("--drift-steps", type=int, default=20)
    p.add_argument("--drift-lr", default="1e-2,1e-5", help="learning rates of the drift runs")
    p.add_argument("--tasks", default="text,vlm")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--long-steps", type=int, default=3000)
    return p.parse_args()


def _config(model: Path, data: Path, mode: str, steps: int = 2, **actor: Any) -> Any:
    from grpo_testkit.configs import text_config
    from grpo_trainer.config import build_config

    precision = "mixed" if mode == "mixed" else "bf16"
    raw = text_config(
        model,
        data,
        actor={"precision": precision, **actor},
        resources={"num_workers": 1},
        trainer={"total_steps": steps},
        metrics={"jsonl": False},  # this script prints its own lines
    )
    return build_config(raw, environ={})


def _group(cfg: Any, mode: str) -> Any:
    """One in-process rank; the bf16 variants the trainer does not offer swapped in."""
    from grpo_testkit.crash import LocalGroup
    from grpo_trainer.optim import BF16AdamW

    group = LocalGroup(cfg)
    w = group.workers[0]
    if mode in ("stochastic", "none"):
        a = cfg.actor
        w.state.optimizer = BF16AdamW(
            w.state.actor.parameters(),
            lr=a.lr,
            betas=a.betas,
            weight_decay=a.weight_decay,
            compensation=mode,
        )
        w.state.scheduler = torch.optim.lr_scheduler.LambdaLR(w.state.optimizer, lambda s: 1.0)
    return group


def _params(group: Any) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The weights the forward pass uses, and the values the optimizer holds for them
    (weight + Kahan compensation; the weight itself in the other modes). One rank:
    every shard is the whole tensor."""
    w = group.workers[0]
    weights, held = {}, {}
    for name, p in w.state.actor.named_parameters():
        full = p.detach().full_tensor() if hasattr(p, "full_tensor") else p.detach()
        weights[name] = full.double()
        comp = w.state.optimizer.state.get(p, {}).get("compensation")
        if comp is not None:
            comp = comp.full_tensor() if hasattr(comp, "full_tensor") else comp
            held[name] = weights[name] + comp.double()
        else:
            held[name] = weights[name]
    return weights, held


def drift(
    model: Path, data: Path, mode: str, lr: float, steps: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """After ``steps`` updates on fixed random batches (the same for every mode): the
    weights and the held values (``_params``)."""
    from grpo_trainer.dataset import PromptDataset

    cfg = _config(model, data, mode, lr=lr)
    records = PromptDataset(cfg.data.train_files, cfg.data).records
    group = _group(cfg, mode)
    try:
        rng = random.Random(0)
        w = group.workers[0]
        # Low ids are ordinary tokens in the tiny tokenizers; never an image placeholder.
        vocab = [t for t in range(3, 64)
                 if t not in w.tokens.suppress_ids and t not in w.tokens.eos_ids]
        for step in range(1, steps + 1):
            batch = rng.sample(records, 2)
            items = [
                (r, [rng.choice(vocab) for _ in range(rng.randint(2, 8))])
                for r in batch
                for _ in range(4)
            ]
            adv = [rng.gauss(0.0, 1.0) for _ in items]
            group.call(Worker.load_samples, [items])
            group.call(Worker.update, [adv], common=[step])
        return _params(group)
    finally:
        group.shutdown()


def learn(model: Path, data: Path, mode: str, steps: int) -> dict[str, Any]:
    from grpo_trainer.driver.driver import GRPOTrainer

    cfg = _config(model, data, mode, steps)
    trainer = GRPOTrainer(cfg)
    group = _group(cfg, mode)
    trainer.group = group
    try:
        history = trainer.run()
    finally:
        trainer.close()
    rewards = [m["reward/mean"] for m in history]
    return {
        "rewards": [round(r, 3) for r in rewards],
        "first4": statistics.mean(rewards[:4]),
        "last4": statistics.mean(rewards[-4:]),
        "update_s": statistics.median(m["time/update_s"] for m in history[1:]),
    }


def optimizer_only(steps: int) -> None:
    """The optimizer alone over a long run: error of the held weights vs float64 AdamW,
    and the second moment's ratio to the reference's, halfway and at the end."""
    from torch import nn

    from grpo_trainer.optim import BF16AdamW

    n, lr = 20_000, 1e-5
    gen = torch.Generator().manual_seed(0)
    w0 = (torch.randn(n, generator=gen) * 0.02).bfloat16().double()
    pull = torch.randn(n, generator=gen, dtype=torch.float64)
    ref = nn.Parameter(w0.clone())
    ref_opt = torch.optim.AdamW([ref], lr=lr, weight_decay=0.01, foreach=False)
    variants = {
        "kahan": {"compensation": "kahan"},
        "kahan-nearest-v": {"compensation": "kahan", "stochastic_variance": False},
        "stochastic": {"compensation": "stochastic"},
        "none": {"compensation": "none"},
    }
    params = {k: nn.Parameter(w0.bfloat16()) for k in variants}
    opts = {
        k: BF16AdamW([params[k]], lr=lr, weight_decay=0.01, **kw)  # type: ignore[arg-type]
        for k, kw in variants.items()
    }
    for t in range(steps):
        scale = 1.0 if t < steps // 2 else 0.1
        noise = torch.randn(n, generator=gen, dtype=torch.float64)
        grad = ((0.3 * pull + noise) * scale * 1e-3).bfloat16()
        ref.grad = grad.double()
        ref_opt.step()
        for k, p in params.items():
            p.grad = grad.clone()
            opts[k].step()
        if t + 1 in (steps // 2, steps):
            moved = float((ref.detach() - w0).norm())
            v_ref = ref_opt.state[ref]["exp_avg_sq"]
            for k, p in params.items():
                st = opts[k].state[p]
                held = p.detach().double() + st.get("compensation", torch.zeros(1)).double()
                row = {
                    "optimizer_only": k,
                    "step": t + 1,
                    "held_err": float((held - ref.detach()).norm()) / moved,
                    "weight_err": float((p.detach().double() - ref.detach()).norm()) / moved,
                    "v_ratio": float((st["exp_avg_sq"].double() / v_ref).median()),
                }
                print(json.dumps(row))


def _bf16_exact(path: Path) -> Path:
    """Round the saved weights to bf16 values (kept float32 on disk): every mode starts
    from the same weights, as from a checkpoint published in bf16, so the drift is the
    training's and not the first rounding's."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText

    vision = getattr(AutoConfig.from_pretrained(path), "vision_config", None) is not None
    cls = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    model = cls.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    model.save_pretrained(path, safe_serialization=True)
    return path


def _rel(
    a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], w0: dict[str, torch.Tensor]
) -> float:
    num = sum(float((a[k] - b[k]).pow(2).sum()) for k in b) ** 0.5
    den = sum(float((b[k] - w0[k]).pow(2).sum()) for k in b) ** 0.5
    return num / den


def main() -> None:
    import logging

    from grpo_testkit.datasets import write_text_task, write_vision_task
    from grpo_testkit.tiny_models import build_tiny_qwen2, build_tiny_qwen2_5_vl

    args = parse_args()
    logging.basicConfig(level=logging.WARNING)
    modes = args.modes.split(",")
    lrs = [float(x) for x in args.drift_lr.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-bf16-"))
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; load {os.getloadavg()}")
    if args.long_steps:
        optimizer_only(args.long_steps)
    for task in args.tasks.split(","):
        if task == "text":
            model, data = build_tiny_qwen2(tmp / "lm"), write_text_task(tmp / "text.jsonl")
            model = _bf16_exact(model)
        else:
            model = _bf16_exact(build_tiny_qwen2_5_vl(tmp / "vlm"))
            data = write_vision_task(tmp / "vision.parquet")
        rows: dict[str, dict[str, Any]] = {m: {} for m in modes}
        for lr in lrs:
            w0, _ = drift(model, data, "mixed", lr, 0)
            ref, _ = drift(model, data, "mixed", lr, args.drift_steps)
            for mode in modes:
                if mode == "mixed":
                    # The floor for bf16 weights: the reference itself rounded to bf16.
                    floor = {k: v.bfloat16().double() for k, v in ref.items()}
                    rows[mode][f"held@{lr:g}"] = 0.0
                    rows[mode][f"weights@{lr:g}"] = _rel(floor, ref, w0)
                    continue
                weights, held = drift(model, data, mode, lr, args.drift_steps)
                rows[mode][f"held@{lr:g}"] = _rel(held, ref, w0)
                rows[mode][f"weights@{lr:g}"] = _rel(weights, ref, w0)
                print(json.dumps({"task": task, "mode": mode, "lr": lr, **rows[mode]}))
        for mode in modes:
            out = learn(model, data, mode, args.steps)
            rows[mode].update(out)
            print(json.dumps({"task": task, "mode": mode, **out}))
        base = rows.get("mixed", {}).get("update_s")
        cols = [f"{kind}@{lr:g}" for lr in lrs for kind in ("held", "weights")]
        print(
            f"\n{task}: mode | "
            + " | ".join(cols)
            + " | reward first4 -> last4 | update s (x mixed)"
        )
        for mode in modes:
            r = rows[mode]
            ratio = f" ({r['update_s'] / base:.2f}x)" if base else ""
            print(
                f"{mode} | "
                + " | ".join(f"{r[c]:.4f}" if c in r else "-" for c in cols)
                + f" | {r['first4']:.3f} -> {r['last4']:.3f} | {r['update_s']:.3f}{ratio}"
            )
    print(f"# end; load {os.getloadavg()}")


if __name__ == "__main__":
    main()
