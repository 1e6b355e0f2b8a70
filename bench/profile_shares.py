"""Where a profiled rank spent its samples: the share of py-spy's collapsed stacks
(``bench_trl.py --profile DIR`` writes one file per rank, ``frame;frame;... count``)
under each stage of our step.

    .venv/bin/python bench/profile_shares.py DIR/ours-rank0.txt DIR/ours-rank1.txt

Shares are of every sample, start-up and Ray's idle waits included; a stage's line
counts a sample if any frame of its stack matches (the indented ones are within the
stage above them).
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

# (label, a substring of a frame in py-spy's raw format: "function (file:line)")
STAGES = (
    ("generate (rollout)", "generate (grpo_trainer/rank/worker.py"),
    ("  weight sync", "sync_rollout_weights"),
    ("  sampling (prefill and decode)", "_sample (grpo_trainer/rollout/hf.py"),
    ("  lean decode step", "step (grpo_trainer/rollout/lean_decode.py"),
    ("update", "update (grpo_trainer/rank/worker.py"),
    ("  collate (packing)", "collate_packed"),
    ("  rope index", "get_rope_index"),
    ("  forward (lean log-probs)", "lean_log_probs"),
    ("  backward", "backward ("),
    ("  optimizer step", "_optimizer_step"),
    ("  metrics all-reduce", "_update_metrics"),
)


def shares(lines: list[str]) -> tuple[int, dict[str, float]]:
    """Total samples and each stage's share of them."""
    total, hits = 0, Counter[str]()
    for line in lines:
        stack, _, count = line.rstrip().rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        for label, marker in STAGES:
            if marker in stack:
                hits[label] += n
    return total, {label: hits[label] / max(total, 1) for label, _ in STAGES}


def main(paths: list[str]) -> None:
    for path in paths:
        total, by_stage = shares(Path(path).read_text().splitlines())
        print(f"{path}: {total} samples")
        for label, share in by_stage.items():
            print(f"  {label:32s} {share:6.1%}")


if __name__ == "__main__":
    main(sys.argv[1:])
