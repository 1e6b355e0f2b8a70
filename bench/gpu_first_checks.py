"""The checks a lent GPU runs first, before the fidelity cases: what only a GPU shows of
the packed mask, a text-only micro-batch beside an image one, and vLLM's model runner.

    python bench/gpu_first_checks.py --out first_checks.json   # on a CUDA GPU, < 1 min
    python bench/gpu_first_checks.py --device cpu              # smoke run, seconds

1. ``mask-alignment``: SDPA's memory-efficient kernel (the one Hopper picks once a mask is
   given) forward and backward with an additive 4-D mask whose last dimension is not a
   multiple of 8, and with the packed width the trainer rounds it to
   (``grpo_api.contract.packed_width``). Measured: the CUDA allocator's peak above the
   inputs for each; a peak for the unaligned width above the aligned one's by about a
   mask's bytes is ATen padding the mask into a copy it keeps for backward (the copy the
   rounding avoids, docs/memory-model.md). Also the trainer's own collation at such a
   width: the mask's last dimension and strides.
2. ``text-beside-image``: the tiny Qwen2.5-VL sharded by FSDP2 on this device (a world of
   one: NCCL on a GPU), an image micro-batch then a text-only one through the reference,
   old and update passes (the chunked head): the vision tower runs in every forward
   (``vision_in_step``), the text-only log-probs are bit-identical to the unhooked
   model's, and the zero image's tower pass costs what the line says.
3. ``segment-attention``: the packed update's attention by segment
   (``grpo_trainer.model.segment_attention``: the prompts causal, SDPA's flash kernel; the
   responses under a small aligned mask, its memory-efficient kernel) against the dense
   4-D mask, on a tiny Qwen2 with grouped KV heads in bf16, 2 rows of a 1,000-token
   prompt and 8 responses of 100-400 tokens: the log-probs' largest gap (bf16 rounding
   only), and each layout's forward and backward time and allocator peak.
4. ``vllm-runner``: the model runner vLLM picks under the trainer's engine environment
   (``vllm_engine.VLLM_ENV_DEFAULTS``), or why it was not checked (no vLLM installed: the
   lent machine has none).

Each check prints one line (``first-check NAME: ok|FAIL|not checked ...``) and the JSON
holds the figures. The device script (``gpu_fidelity_device.sh run``) calls this first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _p in ("api", "operator", "trainer"):  # runnable from a checkout without installing
    if str(ROOT / _p) not in sys.path:
        sys.path.insert(0, str(ROOT / _p))

import torch  # noqa: E402

MIB = 2**20
# A packed width of one 8k-token row plus 3: the case the rounding exists for.
UNALIGNED_WIDTH = 4096 + 3


def _peak_above(fn: Callable[[], object], device: torch.device) -> int | None:
    """The allocator's peak while ``fn`` runs, above what was allocated before (CUDA);
    None on a CPU (no allocator statistics)."""
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - base)


def check_mask_alignment(device: torch.device) -> dict[str, Any]:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from grpo_api.contract import packed_width

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    heads, head_dim = 4, 64
    out: dict[str, Any] = {"dtype": str(dtype)}
    # A CPU has no allocator statistics to show: a small width keeps the smoke run short.
    unaligned = UNALIGNED_WIDTH if device.type == "cuda" else 64 + 3
    for label, width in (("unaligned", unaligned), ("rounded", packed_width(unaligned))):
        q, k, v = (torch.randn(1, heads, width, head_dim, device=device, dtype=dtype,
                               requires_grad=True) for _ in range(3))
        causal = torch.ones(width, width, device=device, dtype=torch.bool).tril()
        mask = torch.zeros(1, 1, width, width, device=device, dtype=dtype)
        mask.masked_fill_(~causal, torch.finfo(dtype).min)
        del causal

        def step(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v,
                 mask: torch.Tensor = mask) -> None:
            backends = ([SDPBackend.EFFICIENT_ATTENTION] if device.type == "cuda"
                        else [SDPBackend.MATH])
            with sdpa_kernel(backends):
                sdpa(q, k, v, attn_mask=mask).sum().backward()

        peak = _peak_above(step, device)
        out[label] = {"width": width, "mask_mib": mask.numel() * mask.element_size() / MIB,
                      "peak_above_inputs_mib": None if peak is None else peak / MIB}
    un, ro = out["unaligned"], out["rounded"]
    if un["peak_above_inputs_mib"] is not None:
        extra = un["peak_above_inputs_mib"] - ro["peak_above_inputs_mib"]
        out["unaligned_extra_mib"] = extra
        out["copies_unaligned_mask"] = extra > 0.5 * un["mask_mib"]
    out["collation"] = _collated_mask()
    ok = out["collation"]["aligned"]
    detail = (f"unaligned width {un['width']}: +{out.get('unaligned_extra_mib', 0):.1f} MiB "
              f"over the rounded {ro['width']} (a mask is {un['mask_mib']:.1f} MiB); "
              f"collated mask {out['collation']['shape']} strides {out['collation']['strides']}"
              if "unaligned_extra_mib" in out else
              f"no allocator statistics on {device.type}; collated mask "
              f"{out['collation']['shape']} strides {out['collation']['strides']}")
    return {"ok": ok, "detail": detail, **out}


def _collated_mask() -> dict[str, Any]:
    """The trainer's packed collation of rows whose longest is 8k + 3 tokens wide."""
    from grpo_trainer.algorithm.packing import collate_packed
    from grpo_trainer.algorithm.samples import EncodedPrompt, Sample
    from grpo_trainer.data import Record

    prompt = EncodedPrompt(Record(0, "", "", []), torch.arange(5, 14))  # 9 prompt tokens
    samples = [Sample(prompt, torch.arange(20, 20 + n), torch.zeros(n), True) for n in (4, 6)]
    batch = collate_packed(samples, 0, torch.float32)
    mask = batch.model_inputs["attention_mask"]
    strides = list(mask.stride())
    return {"raw_width": 9 + 4 + 6, "shape": list(mask.shape), "strides": strides,
            "aligned": mask.shape[-1] % 8 == 0 and all(s % 8 == 0 for s in strides[:-1])}


def check_text_beside_image(device: torch.device, workdir: Path) -> dict[str, Any]:
    import torch.distributed as dist

    from grpo_api.trainer_config import ActorConfig, ModelConfig
    from grpo_testkit.lean_check import run
    from grpo_testkit.mixed_check import batches
    from grpo_testkit.tiny_models import build_tiny_qwen2_5_vl
    from grpo_trainer.model.modeling import load_full, shard_model

    model_dir = build_tiny_qwen2_5_vl(workdir / "tiny-qwen2.5-vl")
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29533")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                rank=0, world_size=1, device_id=device if device.type == "cuda"
                                else None)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    cfg = ActorConfig(dtype="bfloat16" if device.type == "cuda" else "float32")
    mcfg = ModelConfig(path=str(model_dir))
    plain = load_full(mcfg, torch.float32).to(device)
    actor = shard_model(load_full(mcfg, torch.float32).to(device), cfg, device, trainable=True)
    ref = shard_model(load_full(mcfg, torch.float32).to(device), cfg, device, trainable=False)
    calls: list[int] = []
    tower = next(m for n, m in actor.named_modules() if n.endswith("visual.blocks.0"))
    tower.register_forward_hook(lambda *_: calls.append(1))
    image, text = batches(model_dir)
    for b in (image, text):
        b.model_inputs = {k: v.to(device) for k, v in b.model_inputs.items()}
    passes: dict[str, float] = {}
    for name, batch in (("image", image), ("text", text)):
        t0 = time.perf_counter()
        with torch.no_grad():
            run(ref, batch, lean=True, grad=False)
            run(actor, batch, lean=True, grad=False)
        run(actor, batch, lean=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        passes[name] = time.perf_counter() - t0
    with torch.no_grad():
        hooked, _ = run(actor, text, lean=True, grad=False)
    plain.to(torch.bfloat16 if device.type == "cuda" else torch.float32)
    with torch.no_grad():
        unhooked, _ = run(plain, text, lean=True, grad=False)
    gap = max(float((a.float() - b.float()).abs().max()) for a, b in zip(hooked, unhooked,
                                                                          strict=True))
    towers = len(calls)
    dist.destroy_process_group()
    # The actor's forwards (the hook counts its tower, not the reference's): old and
    # update for each micro-batch, and the text-only one again.
    expected = 2 * 2 + 1
    ok = towers == expected
    return {"ok": ok, "tower_passes": towers, "expected_tower_passes": expected,
            "seconds": passes, "text_logp_gap_vs_unsharded": gap,
            "detail": f"actor tower passes {towers} of {expected}; image micro-batch "
                      f"{passes['image']:.2f} s, "
                      f"text-only {passes['text']:.2f} s (its zero-image tower pass included); "
                      f"text log-probs vs the unsharded model's: max gap {gap:.2e}"}


def check_segment_attention(device: torch.device, workdir: Path) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    from grpo_testkit.tiny_models import build_tiny_qwen2
    from grpo_trainer.algorithm.lean_logprobs import lean_log_probs
    from grpo_trainer.algorithm.packing import collate_packed
    from grpo_trainer.algorithm.samples import EncodedPrompt, Sample
    from grpo_trainer.data import Record
    from grpo_trainer.model import segment_attention

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model: Any = AutoModelForCausalLM.from_pretrained(
        build_tiny_qwen2(workdir / "tiny-qwen2"), dtype=dtype, attn_implementation="sdpa")
    model.to(device)
    gen = torch.Generator().manual_seed(0)
    samples = []
    for i in range(2):
        prompt = EncodedPrompt(Record(i, "", "", []), torch.randint(10, 300, (1000,),
                                                                    generator=gen))
        samples += [Sample(prompt, torch.randint(10, 300, (n,), generator=gen),
                           torch.zeros(n), True) for n in range(100, 500, 50)]
    found: dict[str, Any] = {}
    for name in ("dense", "segments"):
        batch = collate_packed(samples, 0, dtype, device=device, segments=name == "segments")
        inputs = {k: v.to(device) for k, v in batch.model_inputs.items()}

        def step(batch: Any = batch, inputs: dict[str, Any] = inputs) -> torch.Tensor:
            model.zero_grad()
            out = lean_log_probs(model, inputs, batch, temperature=1.0, chunk=512,
                                 entropy=False, entropy_grad=False)
            (out.logp * batch.response_mask.to(out.logp.device)).sum().backward()
            return out.logp.detach().float().cpu()

        step()  # the kernels' first launch
        t0 = time.perf_counter()
        logp = step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        found[name] = {"seconds": time.perf_counter() - t0, "peak_above_mib":
                       (_peak_above(step, device) or 0) / MIB, "logp": logp}
        if name == "dense":
            assert segment_attention.install(model)
    gap = float((found["segments"].pop("logp") - found["dense"].pop("logp")).abs().max())
    ok = gap < (5e-2 if dtype == torch.bfloat16 else 1e-4)
    d, s = found["dense"], found["segments"]
    return {"ok": ok, "logp_gap": gap, **found,
            "detail": f"log-prob gap {gap:.2e}; forward+backward dense {d['seconds']:.3f} s "
                      f"vs segments {s['seconds']:.3f} s; allocator peak above the inputs "
                      f"{d['peak_above_mib']:.0f} vs {s['peak_above_mib']:.0f} MiB"}


def check_vllm_runner() -> dict[str, Any]:
    from grpo_trainer.rollout.vllm_engine import VLLM_ENV_DEFAULTS

    try:
        import vllm  # noqa: F401
    except ImportError:
        return {"ok": None, "env": VLLM_ENV_DEFAULTS,
                "detail": f"vLLM is not installed here: not checked (the engines set "
                          f"{VLLM_ENV_DEFAULTS})"}
    os.environ.update(VLLM_ENV_DEFAULTS)
    import vllm.envs as envs

    v2 = bool(getattr(envs, "VLLM_USE_V2_MODEL_RUNNER", False))
    return {"ok": not v2, "env": VLLM_ENV_DEFAULTS, "v2_model_runner": v2,
            "detail": f"VLLM_USE_V2_MODEL_RUNNER under the engines' env: {v2}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu for the smoke run", file=sys.stderr)
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    results: dict[str, Any] = {"device": torch.cuda.get_device_name(0)
                               if args.device == "cuda" else "cpu",
                               "torch": torch.__version__}
    with tempfile.TemporaryDirectory(prefix="gpu-first-checks-") as work:
        checks: dict[str, Callable[[], dict[str, Any]]] = {
            "mask-alignment": lambda: check_mask_alignment(device),
            "text-beside-image": lambda: check_text_beside_image(device, Path(work)),
            "segment-attention": lambda: check_segment_attention(device, Path(work)),
            "vllm-runner": check_vllm_runner,
        }
        for name, check in checks.items():
            t0 = time.perf_counter()
            try:
                found = check()
            except Exception as err:  # a check that cannot run says why; the rest go on
                found = {"ok": False, "detail": f"{type(err).__name__}: {err}",
                         "traceback": traceback.format_exc()}
            found["seconds_total"] = time.perf_counter() - t0
            results[name] = found
            verdict = {True: "ok", False: "FAIL", None: "not checked"}[found["ok"]]
            print(f"first-check {name}: {verdict} ({found['seconds_total']:.1f} s): "
                  f"{found['detail']}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2, default=str))
    return 0 if all(r.get("ok") is not False for r in results.values()
                    if isinstance(r, dict)) else 1


if __name__ == "__main__":
    sys.exit(main())
