"""vLLM rollouts colocated with the FSDP actor on the same GPU (gpu tier only).

One vLLM engine per rank (data-parallel rollout, tensor_parallel_size=1), built
with sleep mode so it gives its GPU memory back while FSDP trains:

    sleep(level=1) during the update   -> weights to host, KV cache freed
    wake(tags=["weights"]) before sync -> weight buffers back, no KV cache yet
    load_weights(stream)               -> one FSDP parameter at a time
    wake(tags=["kv_cache"])            -> KV cache re-allocated for generation

Weights come from the FSDP shards one parameter at a time (``full_tensor`` of a
single DTensor), so no rank ever holds a full copy of the model. vLLM is imported
lazily: this module must import on machines without it (CI, the operator).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ..samples import EncodedPrompt
from .base import Generation, SamplingSpec

# Parameters are handed to vLLM in buckets of about this many bytes: large enough
# to amortise the per-call overhead, small enough to keep the transient bounded.
BUCKET_BYTES = 256 * 1024 * 1024


def _buckets(
    weights: Iterable[tuple[str, torch.Tensor]],
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, t in weights:
        bucket.append((name, t))
        size += t.numel() * t.element_size()
        if size >= BUCKET_BYTES:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        *,
        dtype: str,
        gpu_memory_utilization: float,
        max_model_len: int,
        seed: int,
        enable_sleep_mode: bool,
        trust_remote_code: bool = False,
        max_images_per_prompt: int = 4,
    ) -> None:
        # In-process engine core: weight loading reaches the model object directly.
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        from vllm import LLM

        kwargs: dict[str, Any] = {
            "model": model_path,
            "dtype": dtype,
            "tensor_parallel_size": 1,
            "gpu_memory_utilization": gpu_memory_utilization,
            "max_model_len": max_model_len,
            "seed": seed,
            "enable_sleep_mode": enable_sleep_mode,
            "trust_remote_code": trust_remote_code,
            "enable_prefix_caching": False,  # weights change every step
            "limit_mm_per_prompt": {"image": max_images_per_prompt},
            # Log-probs after temperature scaling: what the actor recomputes.
            "logprobs_mode": "processed_logprobs",
        }
        try:
            self.llm = LLM(**kwargs)
        except TypeError:  # older vLLM without logprobs_mode
            kwargs.pop("logprobs_mode")
            self.llm = LLM(**kwargs)
        self.sleep_mode = enable_sleep_mode
        self.asleep = False
        if enable_sleep_mode:
            self.sleep()

    def wake(self) -> None:
        if self.sleep_mode and self.asleep:
            self.llm.wake_up(tags=["weights"])

    def sleep(self) -> None:
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def _apply(self, fn: Any) -> None:
        if hasattr(self.llm, "apply_model"):
            self.llm.apply_model(fn)
            return
        engine = self.llm.llm_engine
        fn(engine.model_executor.driver_worker.worker.model_runner.model)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        device = torch.device("cuda", torch.cuda.current_device())
        for bucket in _buckets(weights):
            on_gpu = [(n, t.to(device, non_blocking=True)) for n, t in bucket]
            # vLLM maps Hugging Face names to its own layout (fused qkv, etc.).
            self._apply(lambda model, b=on_gpu: model.load_weights(weights=b))
            del on_gpu
        if self.sleep_mode and self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False
        self.llm.reset_prefix_cache()

    def generate(self, prompts: list[EncodedPrompt], spec: SamplingSpec) -> list[list[Generation]]:
        from vllm import SamplingParams

        params = SamplingParams(
            n=spec.n,
            temperature=spec.temperature,
            top_p=spec.top_p,
            max_tokens=spec.max_new_tokens,
            logprobs=0,  # the sampled token's log-prob only
            seed=spec.seed,
            logit_bias={i: -100.0 for i in spec.suppress_ids} or None,
        )
        inputs: list[dict[str, Any]] = []
        for p in prompts:
            item: dict[str, Any] = {"prompt_token_ids": p.raw_prompt_ids}
            if p.images:
                # vLLM expands the single placeholder per image itself.
                item["multi_modal_data"] = {"image": p.images}
            inputs.append(item)
        outputs = self.llm.generate(inputs, params, use_tqdm=False)
        result: list[list[Generation]] = []
        for out in outputs:
            gens: list[Generation] = []
            for c in out.outputs:
                ids = list(c.token_ids)
                lps = [
                    next(iter(d.values())).logprob if tid not in d else d[tid].logprob
                    for tid, d in zip(ids, c.logprobs or [], strict=False)
                ]
                gens.append(
                    Generation(
                        torch.tensor(ids, dtype=torch.long),
                        torch.tensor(lps, dtype=torch.float32),
                        finished=c.finish_reason == "stop",
                    )
                )
            result.append(gens)
        return result
