"""A process's start with the virtualenv's bytecode compiled, against compiling it afresh.

Where no process may write ``.pyc`` (``PYTHONDONTWRITEBYTECODE=1`` as CI's machine sets,
or an image's user that cannot write into the virtualenv), a virtualenv without its
bytecode is compiled again, module by module, by every process that imports it: the
driver, each Ray worker, each vLLM process. ``hack/setup.sh`` and the images' install.sh
compile it once. The baseline, in the same run: the same commands with
``PYTHONPYCACHEPREFIX`` pointing at an empty directory, so Python finds no bytecode and
compiles everything (and, with ``PYTHONDONTWRITEBYTECODE=1``, writes nothing); the
variable reaches Ray's workers, which inherit the driver's environment.

Two commands, each ``--rounds`` times, alternating:
* ``import``: what a trainer process imports at start (the driver, the rank worker,
  the rewards, vLLM, transformers' Qwen2 and Qwen2.5-VL model code);
* ``run``: a whole one-step run of the tiny text task (``python -m grpo_trainer``: the
  driver, a local Ray, two rank actors, the step, the save).

    .venv/bin/python bench/bench_bytecode.py [--rounds 2]

Prints one JSON line per measurement, then the medians and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

IMPORTS = ("import grpo_trainer.driver.driver, grpo_trainer.rank.worker, grpo_trainer.rewards, "
           "vllm; "
           "from transformers.models import qwen2, qwen2_5_vl; qwen2.Qwen2ForCausalLM; "
           "qwen2_5_vl.Qwen2_5_VLForConditionalGeneration")


def timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.monotonic()
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{argv} failed:\n{(proc.stdout + proc.stderr)[-3000:]}")
    return time.monotonic() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    from grpo_testkit.configs import text_config
    from grpo_testkit.datasets import write_text_task
    from grpo_testkit.tiny_models import build_tiny_qwen2

    work = Path(tempfile.mkdtemp(prefix="bench-bytecode-"))
    model = build_tiny_qwen2(work / "model")
    data = write_text_task(work / "t.jsonl")
    base = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    base.pop("PYTHONPYCACHEPREFIX", None)
    modes = {"compiled": base,
             "compiling": {**base, "PYTHONPYCACHEPREFIX": str(work / "no-bytecode")}}
    times: dict[tuple[str, str], list[float]] = {}
    for r in range(args.rounds):
        for mode, env in modes.items():
            config = work / f"{mode}-{r}.yaml"
            config.write_text(yaml.safe_dump(text_config(
                model, data, checkpoint={"dir": str(work / f"ckpt-{mode}-{r}")},
                trainer={"total_steps": 1})))
            commands = {"import": [sys.executable, "-c", IMPORTS],
                        "run": [sys.executable, "-m", "grpo_trainer", "--config", str(config)]}
            for what, argv in commands.items():
                s = timed(argv, env)
                times.setdefault((what, mode), []).append(s)
                print(json.dumps({"round": r, "command": what, "mode": mode, "s": round(s, 2),
                                  "load": round(os.getloadavg()[0], 2)}), flush=True)
    print(f"\n{'command':8} {'compiled s':>11} {'compiling s':>12} {'ratio':>6}")
    for what in ("import", "run"):
        ours = statistics.median(times[(what, "compiled")])
        baseline = statistics.median(times[(what, "compiling")])
        print(f"{what:8} {ours:11.1f} {baseline:12.1f} {baseline / ours:6.2f}x")


if __name__ == "__main__":
    main()
