"""A reward written for GRPO Operator that reads the whole row: a column other than the
answer (``weight``) and the row's image (its width), and records what it saw in the file
``ROW_READER_LOG`` names (one JSON line per response) so a test can check it."""

from __future__ import annotations

import json
import os
from typing import Any


def score(sample: Any) -> dict[str, float]:
    widths = [im.size[0] for im in sample.images]
    log = os.environ.get("ROW_READER_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"index": sample.index, "prompt": sample.prompt,
                                "weight": sample.row.get("weight"), "widths": widths,
                                "ground_truth": sample.ground_truth}) + "\n")
    hit = 1.0 if sample.ground_truth in sample.response else 0.0
    return {"overall": hit * float(sample.row["weight"]) + 0.001 * sum(widths),
            "accuracy": hit}


def score_batch(samples: list[Any]) -> list[float]:
    return [float(len(s.response)) for s in samples]
