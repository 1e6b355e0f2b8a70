"""One attention layer of the update's packed rows, by segment against the dense mask, as
the row grows toward a real job's (docs/benchmarks.md, "Text by segment").

    .venv/bin/python bench/bench_segment_attention.py [--heads 4] [--head-dim 64]

A row is a P-token prompt and n responses of R tokens (the text bench's row is about
P=40, n=8, R=57). For each shape: forward and backward time of the dense mask's SDPA
(the baseline, ``actor.segment_attention=false``) and of ``segment_attention`` on the
same q/k/v, in this process, the median of 3 after one untimed; the layouts' bytes by
grpo_api.contract's counts; the outputs' largest gap. One thread, float32 (a CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in ("api", "trainer"):
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

import torch  # noqa: E402
from torch import nn  # noqa: E402

SHAPES = [(40, 57, 8), (256, 256, 8), (1024, 512, 8), (2048, 1024, 5), (1024, 2048, 4)]


class _Attention(nn.Module):
    """What transformers' sdpa_attention_forward reads of a layer: no grouped KV heads,
    causal."""

    num_key_value_groups = 1
    is_causal = True


def _timed(fn: Any) -> float:
    fn()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run_shape(p: int, r: int, n: int, heads: int, head_dim: int) -> dict[str, Any]:
    from grpo_api.contract import dense_mask_bytes, packed_width, segment_layout_bytes
    from grpo_trainer.algorithm.packing import packed_mask
    from grpo_trainer.model.segment_attention import segment_attention, segment_layout

    width = packed_width(p + n * r)
    seg = torch.full((1, width), -1, dtype=torch.int32)
    seg[0, :p] = 0
    responses = []
    for k in range(n):
        seg[0, p + k * r : p + (k + 1) * r] = k + 1
        responses.append((0, p + k * r, r))
    gen = torch.Generator().manual_seed(0)
    q, k_, v = (torch.randn(1, heads, width, head_dim, generator=gen, requires_grad=True)
                for _ in range(3))
    module = _Attention()
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def dense() -> torch.Tensor:
        mask = packed_mask(seg, torch.float32)
        out, _ = sdpa_attention_forward(module, q, k_, v, mask, scaling=head_dim**-0.5)
        out.sum().backward()
        return out.detach()

    def segments() -> torch.Tensor:
        layout = segment_layout([p], responses, width, torch.float32)
        out, _ = segment_attention(module, q, k_, v, seg[:, None, None, :],
                                   scaling=head_dim**-0.5, segment_layout=layout)
        out.sum().backward()
        return out.detach()

    real = seg[0] >= 0
    gap = float((dense()[0, real] - segments()[0, real]).abs().max())
    t_dense, t_seg = _timed(dense), _timed(segments)
    return {
        "prompt": p, "response": r, "n": n, "row_tokens": width,
        "dense_s": t_dense, "segments_s": t_seg, "speedup": t_dense / t_seg,
        "dense_mask_mib": dense_mask_bytes(1, width, 4) / 2**20,
        "segment_layout_mib": segment_layout_bytes(width, [(n, r)], n * r, p, 4) / 2**20,
        "max_gap": gap,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--head-dim", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(json.dumps({"load_avg_1m": os.getloadavg()[0], "torch": torch.__version__}))
    for p, r, n in SHAPES:
        res = run_shape(p, r, n, args.heads, args.head_dim)
        print(json.dumps({k: round(v, 4) if isinstance(v, float) else v
                          for k, v in res.items()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
