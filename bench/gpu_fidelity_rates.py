"""What ``bench/gpu_fidelity.py``'s update achieved: tokens per second and MFU, and the host
side of each case (the rank's RSS and pinned bytes against the plan's host terms).

MFU is the model's FLOPs per second over the card's dense bf16 peak, as EasyR1 reports
for its actor (16-23% for Qwen2.5-VL-7B on 8 x H100). The FLOPs are counted from the
shape, per sample of prompt + response tokens, over the passes the update makes:
- the policy update, forward and backward: 6 N per token for the decoder's weights
  (4 N with LoRA: no weight gradients of the frozen base), plus causal attention, 6 L h s
  per token of an s-token sequence (the score and value products, half the square);
- each forward-only pass (reference, old log-probs when off-policy): a third of that;
- the vision tower once per pass on the image's patches (14 x 14 pixels each), 6 (or
  2, forward only) x its parameters per patch.
It is a model figure (no recomputation under gradient checkpointing, no padding), so
the same work counts the same whatever the settings.
"""

from __future__ import annotations

from typing import Any

GIB = 2**30
# Dense bf16 tensor-core peaks, TFLOP/s (the vendors' datasheets, without sparsity).
PEAK_BF16_TFLOPS = {
    "H100-80GB": 989.4,  # SXM5
    "H200-141GB": 989.4,
    "A100-80GB": 312.0,
    "A100-40GB": 312.0,
    "L40S-48GB": 362.1,
    "L4-24GB": 121.0,
}
PATCH_PIXELS = 14 * 14
# The rank's own host terms (the bench runs one rank: no Ray, driver or rollout engine).
RANK_HOST_TERMS = ("rank_processes", "offloaded_params_and_grads", "offloaded_optimizer",
                   "weight_sync_buffers", "async_save_staging")


def update_flops(shape: Any, samples: int, tokens: int, pixels: int, lora: bool,
                 forward_passes: int) -> float:
    """Model FLOPs of one step's update over ``samples`` sequences of ``tokens`` tokens,
    each with one image of ``pixels``; ``forward_passes`` forward-only passes besides."""
    lm = shape.parameters - shape.vision_parameters
    attention = 6 * shape.layers * shape.hidden_size * tokens  # per token, causal fwd+bwd
    train = (4 if lora else 6) * lm + attention
    per_sample = tokens * (train + forward_passes * (2 * lm + attention / 3))
    patches = pixels / PATCH_PIXELS
    per_sample += patches * shape.vision_parameters * ((4 if lora else 6) + 2 * forward_passes)
    return samples * per_sample


def rates(entry: dict[str, Any], plan: Any, gpu_type: str, steps: int) -> dict[str, Any] | None:
    """Tokens/s and MFU of the case's last step's update (its three timed parts)."""
    metrics = entry.get("metrics") or {}
    seconds = sum(metrics.get(k, 0.0) for k in
                  ("time/old_logprob_s", "time/ref_logprob_s", "time/update_s"))
    if not seconds or entry.get("error"):
        return None
    g = plan.geometry
    samples, tokens = g.global_batch_size, g.sequence_length
    forward = int(metrics.get("time/ref_logprob_s", 0.0) > 0) + int(
        metrics.get("time/old_logprob_s", 0.0) > 0)
    flops = update_flops(g.shape, samples, tokens, g.max_pixels, g.lora is not None, forward)
    peak = PEAK_BF16_TFLOPS.get(gpu_type)
    return {
        "step": steps, "seconds": seconds, "tokens_per_s": samples * tokens / seconds,
        "tflops": flops / seconds / 1e12, "peak_tflops": peak,
        "mfu": flops / seconds / (peak * 1e12) if peak else None,
    }


def host_side(entry: dict[str, Any], plan: Any) -> dict[str, Any]:
    """The rank's host RSS peak and pinned bytes against the plan's host terms, GiB."""
    terms = plan.budget.host_terms
    marks = entry.get("marks") or []
    rss = max((m.get("host_peak_rss") or 0 for m in marks), default=0)
    pinned = max((m.get("pinned", {}).get("allocated_bytes.peak", 0) for m in marks),
                 default=0)
    last = next((m["pinned"] for m in reversed(marks) if m.get("pinned")), {})
    ranks = plan.geometry.ranks_per_node
    # Pinned (planner/pinned.py): FSDP2's offloaded shards with offloaded parameters, else
    # the moments moved off the GPU; an async save's staging either way.
    pinned_terms = ("offloaded_params_and_grads" if plan.settings.offload_params
                    else "offloaded_optimizer", "async_save_staging")
    return {
        "planned_terms": {k: terms.get(k, 0.0) / ranks for k in RANK_HOST_TERMS},
        "planned_rank": sum(terms.get(k, 0.0) for k in RANK_HOST_TERMS) / ranks,
        "planned_pinned": sum(terms.get(k, 0.0) for k in pinned_terms) / ranks,
        "rss_peak": rss / GIB if rss else None,
        "pinned_peak": pinned / GIB if pinned else None,
        "host_allocs": last.get("num_host_alloc"),
        "host_alloc_ms": last.get("host_alloc_time.total", 0.0) / 1e3 if last else None,
    }
