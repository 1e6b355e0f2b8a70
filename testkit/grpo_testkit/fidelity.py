"""The rank side of ``bench/gpu_fidelity.py``: one rank's load and update, measured.

A case runs what a trainer rank runs between ``setup`` and the end of an update, with
the trainer's own code: ``modeling.build_sharded`` (the configured init strategy, FSDP2
``fully_shard``), ``precision.build_optimizer``, and ``PolicyUpdate.run`` (old and
reference log-probs, the GRPO loss over micro-batches with gradient accumulation, the
optimizer step). What it leaves out is Ray, the tokenizer's data pipeline and the
rollout engine: the samples are made here, of the planned lengths, with one image of
``data.image_max_pixels`` per prompt encoded by the real Qwen2.5-VL processor.

World size 1 on one device, NCCL on a GPU and gloo on a CPU. Only torch, transformers
and pure-Python packages are imported (no Ray, no vLLM): it runs on a bare GPU machine.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from grpo_api.trainer_config import Config
from grpo_trainer.algorithm.samples import EncodedPrompt, PromptEncoder, Sample
from grpo_trainer.cluster.devices import free_port, process_group_backend
from grpo_trainer.data import Record, load_template
from grpo_trainer.media.images import PixelBounds, processor_bounds
from grpo_trainer.model.rank_state import RankState, World, build_rank_state
from grpo_trainer.rank.policy_update import PolicyUpdate

from .memory_probe import (
    MemoryProbe,
    gpu_identity,
    grad_bytes,
    optimizer_state_bytes,
    param_bytes,
)

log = logging.getLogger(__name__)

COMPLETE = ".complete"  # written last: a checkpoint directory without it is rewritten
# Qwen2.5-VL's special tokens: the config's ids must be the tokenizer's.
VL_TOKENS = {
    "image_token_id": "<|image_pad|>",
    "video_token_id": "<|video_pad|>",
    "vision_start_token_id": "<|vision_start|>",
    "vision_end_token_id": "<|vision_end|>",
    "bos_token_id": "<|endoftext|>",
    "eos_token_id": "<|im_end|>",
    "pad_token_id": "<|endoftext|>",
}


def preload() -> None:
    """Import what a case imports lazily (the model, processor and loader modules), so
    that processes forked from this one start with them loaded."""
    import safetensors.torch  # noqa: F401
    import transformers.models.qwen2_5_vl.modeling_qwen2_5_vl
    import transformers.models.qwen2_5_vl.processing_qwen2_5_vl
    import transformers.models.qwen2_vl.image_processing_qwen2_vl  # noqa: F401
    from transformers import AutoModelForImageTextToText, AutoProcessor  # noqa: F401

    from grpo_trainer import lora  # noqa: F401
    from grpo_trainer.model import sharded_load  # noqa: F401


def progress(what: str, t0: float) -> None:
    print(f"[gpu_fidelity {time.monotonic() - t0:7.1f} s] {what}", flush=True)


# -- the checkpoint ---------------------------------------------------------------
def _device(name: str) -> torch.device:
    if name != "cuda":
        return torch.device("cpu")
    if torch.cuda._is_in_bad_fork():
        raise RuntimeError("CUDA was started in the process this case was forked from: the "
                           "bench's parent must not touch CUDA (PYTORCH_NVML_BASED_CUDA_CHECK=1)")
    if not torch.cuda.is_available():
        raise RuntimeError("device cuda: torch sees no CUDA GPU here (torch.cuda.is_available() "
                           "is False); the CPU smoke run is --device cpu")
    return torch.device("cuda", 0)


def write_random_checkpoint(
    config: dict[str, Any], path: Path, device: str, max_pixels: int, seed: int = 0
) -> Path:
    """A random-weight checkpoint of ``config`` (a Qwen2.5-VL config.json) in bf16, as
    published checkpoints are, with a tokenizer and a processor for ``max_pixels``
    images: what the trainer's loader reads. Built on ``device`` (fast on a GPU)."""
    from transformers import AutoConfig, AutoModelForImageTextToText

    from .tiny_models import build_tokenizer, save_vl_processor

    path.mkdir(parents=True, exist_ok=True)
    (path / COMPLETE).unlink(missing_ok=True)
    tok = build_tokenizer()
    if len(tok) > int(config["vocab_size"]):
        raise ValueError(f"vocab_size {config['vocab_size']} < the tokenizer's {len(tok)}")
    ids = {key: tok.convert_tokens_to_ids(token) for key, token in VL_TOKENS.items()}
    (path / "config.json").write_text(json.dumps({**config, **ids}, indent=1))
    hf_config = AutoConfig.from_pretrained(path)
    torch.manual_seed(seed)
    with torch.device(_device(device)):
        model = AutoModelForImageTextToText.from_config(hf_config, dtype=torch.bfloat16)
    model.save_pretrained(path)
    del model
    save_vl_processor(path, tok, max_pixels=max_pixels)
    (path / COMPLETE).write_text("")
    return path


def checkpoint_ready(path: Path) -> bool:
    return (path / COMPLETE).exists()


# -- the samples ------------------------------------------------------------------
def _noise_png(side: int, gen: torch.Generator) -> bytes:
    from PIL import Image

    pixels = (torch.rand(side, side, 3, generator=gen) * 255).to(torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def _lengthened(prompt: EncodedPrompt, length: int, filler: torch.Tensor) -> EncodedPrompt:
    """``prompt`` grown to ``length`` tokens by text tokens in front (a long context)."""
    extra = length - prompt.input_ids.numel()
    if extra <= 0:
        return prompt
    head = filler[:extra]
    extras = {
        k: torch.cat([torch.zeros(extra, dtype=v.dtype), v]) for k, v in prompt.token_extras.items()
    }
    return replace(prompt, input_ids=torch.cat([head, prompt.input_ids]), token_extras=extras)


QUESTION = "<image> How many shapes are in the picture?"


def synthetic_samples(cfg: Config, vocab_size: int, seed: int = 0) -> tuple[list[Sample], int]:
    """The rank's samples of one step at the planned lengths: ``trainer.rollout_batch_size``
    prompts of ``data.max_prompt_length`` tokens, each with one noise image of about
    ``data.image_max_pixels`` pixels (encoded by the model's processor, as the trainer
    encodes prompts), and ``rollout.n`` responses of ``rollout.max_new_tokens`` random
    tokens each. Returns them and the pad id."""
    from transformers import AutoProcessor, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg.model.path)
    processor = AutoProcessor.from_pretrained(cfg.model.path)
    bounds = PixelBounds(cfg.data.image_min_pixels, cfg.data.image_max_pixels,
                         processor_bounds(processor.image_processor).factor)
    encoder = PromptEncoder(processor, tok, load_template(cfg.data.format_prompt), bounds)
    gen = torch.Generator().manual_seed(seed)
    low = len(tok)  # ids above the tokenizer's: never a special or placeholder token
    side = max(28, math.isqrt(cfg.data.image_max_pixels) // 28 * 28)
    prompt_len, response_len = cfg.data.max_prompt_length, cfg.rollout.max_new_tokens
    samples: list[Sample] = []
    for i in range(cfg.trainer.rollout_batch_size):
        image = _noise_png(side, gen)
        prompt = encoder.encode(Record(i, QUESTION, "3", [image]))
        if prompt.input_ids.numel() > prompt_len:
            log.warning("prompt %d: %d tokens > data.max_prompt_length %d (the image alone)",
                        i, prompt.input_ids.numel(), prompt_len)
        filler = torch.randint(low, vocab_size, (max(0, prompt_len),), generator=gen)
        prompt = _lengthened(prompt, prompt_len, filler)
        for _ in range(cfg.rollout.n):
            response = torch.randint(low, vocab_size, (response_len,), generator=gen)
            samples.append(Sample(prompt, response, torch.zeros(response_len), True))
    return samples, int(tok.pad_token_id)


@dataclass(frozen=True)
class CaseJob:
    """One case for a fresh process: the trainer config the operator would render for
    the plan, the plan's environment, the device, and how many steps to run."""

    name: str
    config: dict[str, Any]
    env: dict[str, str]
    device: str  # "cuda" | "cpu"
    vocab_size: int
    steps: int = 2
    started: float | None = None  # the run's time.monotonic() start, for progress lines


@dataclass
class CaseResult:
    name: str
    device: dict[str, Any]
    marks: list[dict[str, Any]] = field(default_factory=list)
    # Bytes by role ("weights", "frozen", "reference_model", "grads", "optimizer"), each
    # by device type: where the trainer's tensors really are.
    components: dict[str, dict[str, int]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    error: dict[str, str] | None = None


def _init_process_group(device: torch.device) -> None:
    """World size 1 with the backend the trainer's Worker takes for this device."""
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        process_group_backend(device.type),
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
    )


def _hook_optimizer(rank: RankState, probe: MemoryProbe, result: CaseResult) -> None:
    """Marks around every optimizer step: the backward's peak and the gradients just
    before it, the step's own peak and the optimizer state just after it."""
    steps = [0]

    def before(opt: torch.optim.Optimizer, *_: Any) -> None:
        steps[0] += 1
        result.components["grads"] = grad_bytes(rank.actor)
        probe.mark(f"step{steps[0]}:backward")

    def after(opt: torch.optim.Optimizer, *_: Any) -> None:
        result.components["optimizer"] = optimizer_state_bytes(opt)
        probe.mark(f"step{steps[0]}:optimizer")

    rank.optimizer.register_step_pre_hook(before)
    rank.optimizer.register_step_post_hook(after)


def run_case(job: CaseJob) -> CaseResult:
    """Load and update as a rank does, marking memory at each stage; an out-of-memory
    error ends the case and is reported, with the marks up to it."""
    t0 = time.monotonic()
    shown = job.started if job.started is not None else t0
    os.environ.update(job.env)  # before CUDA starts: the allocator reads its config then
    cfg = Config.model_validate(job.config)
    device = _device(job.device)
    torch.set_num_threads(max(1, min(int(cfg.resources.cpus_per_worker), os.cpu_count() or 1)))
    _init_process_group(device)
    identity = gpu_identity(device) if device.type == "cuda" else {"name": "cpu"}
    result = CaseResult(job.name, identity)
    probe = MemoryProbe(device)
    probe.mark("init")
    try:
        progress(f"{job.name}: loading {cfg.model.path}", shown)
        # The rank's update half, built as ``Worker.setup`` builds it; no tokenizer or
        # rollout engine (vLLM), which this machine may not have.
        rank = build_rank_state(cfg, device, World(0, 1, dist.group.WORLD), probe.mark)
        result.components["weights"] = param_bytes(rank.actor, trainable=True)
        result.components["frozen"] = param_bytes(rank.actor, trainable=False)
        if rank.ref is not None and rank.ref is not rank.actor:
            result.components["reference_model"] = param_bytes(rank.ref, trainable=False)
        progress(f"{job.name}: loaded; encoding {cfg.samples_per_step} samples", shown)
        samples, pad_id = synthetic_samples(cfg, job.vocab_size, cfg.trainer.seed)
        policy = PolicyUpdate(rank, pad_id)
        _hook_optimizer(rank, probe, result)
        gen = torch.Generator().manual_seed(cfg.trainer.seed)
        for step in range(1, job.steps + 1):
            for s in samples:  # a new step's log-probs and advantages, as the driver sends
                s.old_log_probs = s.ref_log_probs = None
                s.advantage = float(torch.randn(1, generator=gen))
            probe.mark(f"step{step}:start")
            result.metrics = policy.run(samples, step)
            probe.mark(f"step{step}:end")
            progress(f"{job.name}: step {step} done", shown)
    except torch.OutOfMemoryError as oom:
        at = probe.marks[-1].name if probe.marks else "init"
        result.error = {"kind": "oom", "after": at, "message": str(oom).splitlines()[0]}
        probe.mark("oom")
        progress(f"{job.name}: out of memory after {at}", shown)
    finally:
        probe.stop()
        result.marks = probe.to_json()
        result.seconds = time.monotonic() - t0
        dist.destroy_process_group()
    return result
