"""vLLM rollouts colocated with the FSDP actor, one code path for CUDA and CPU.

Each group of ``tensor_parallel_size`` consecutive trainer ranks shares one engine,
sharded across those ranks: vLLM's ``external_launcher`` executor runs on the
trainer's own ``torch.distributed`` ranks (as verl and TRL do), so vLLM builds its
TP groups over the world the trainer already initialised and every rank of a group
runs the same deterministic scheduler on the same prompts. Ranks of different groups
generate for different prompts (data parallel).

Per step (``RolloutEngine`` lifecycle):

    wake()          CUDA: weight memory back from sleep; CPU: nothing to do
    load_weights()  vLLM's in-place reload (``reload_weights``), fed lazily from the
                    FSDP bucket gather: each layer is restored, filled and repacked
                    as its tensors arrive, so neither a second full copy nor more
                    than one gathered bucket (plus the layer being filled) is held.
                    Every TP rank passes full tensors; vLLM's loaders keep only this
                    rank's slice.
    generate()      per-prompt seeds, so a prompt's samples do not depend on which
                    rank or TP layout generated it
    load_adapter()  LoRA instead of load_weights: only the adapter tensors, served as a
                    vLLM LoRA request over the base loaded once from the model path
    sleep()         the encoder cache (this rollout's vision embeddings) emptied; CUDA:
                    KV cache freed while FSDP trains, CUDA graphs backed up to host, and
                    the weights discarded (level 2: the next load_weights rewrites every
                    one) or, with LoRA, moved to host (level 1: the base is never sent
                    again); CPU: sleep mode does not exist, the engine keeps its weights
                    (the planner's host budget counts them)

Images reach vLLM already resized to the trainer's pixel bounds (grpo_trainer.media.images),
and vLLM gets the same bounds, so its prompt has the trainer's tokens (checked per prompt).
Videos reach it as the frames the trainer sampled and resized (grpo_trainer.media.videos), with
their metadata (source fps, sampled frame indices: Qwen2.5-VL's temporal positions and
Qwen3-VL's frame times follow from it), and vLLM is told to neither sample nor resize them.

The engine loads the checkpoint once at start-up even though the first load_weights
rewrites every parameter: vLLM's placeholder weights (``load_format="dummy"``) also
randomise persistent buffers that no weight stream carries (Qwen2.5-VL's image
normalisation, ``visual.input_norm``), while a level-2 sleep keeps buffers (vLLM copies
them to host and back). ``engine_kwargs`` and ``sleep_level`` decide from the config
alone (CPU tests pin what only CUDA runs).

vLLM is imported lazily: this module imports on machines without it (the operator).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from grpo_api.model.config_json import head_dim, text_fields
from grpo_api.model.kv_cache import engine_kv_cache_bytes, kv_bytes_per_token
from grpo_api.trainer_config import MAX_IMAGES_PER_PROMPT, LoraConfig

from ..algorithm.samples import EncodedPrompt
from ..cluster.collectives import collective_kwargs, restore_local_rank
from ..lora.vllm_adapter import AdapterSlot
from ..media.images import PixelBounds
from ..media.videos import VideoSpec
from .base import Generation, SamplingSpec
from .stale_shm import remove_stale_vllm_segments

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class VLLMEngineConfig:
    model_path: str
    dtype: str
    tensor_parallel_size: int
    max_model_len: int
    # Sequences alive at once in one engine: the TP group's prompts x n.
    max_num_seqs: int
    # CUDA: fraction of the GPU for weights + KV cache (the planner's number).
    gpu_memory_utilization: float
    # CPU: vLLM would reserve gpu_memory_utilization x host RAM for its KV cache;
    # the trainer sizes the cache for max_num_seqs full-length sequences instead.
    cpu_kv_cache_bytes: int
    seed: int
    enable_sleep_mode: bool
    trust_remote_code: bool = False
    # vLLM's limit_mm_per_prompt for images: the data's most (data.max_images_per_prompt).
    max_images_per_prompt: int = MAX_IMAGES_PER_PROMPT
    # LoRA (actor.lora): the adapter rank; 0 without LoRA. The engine then serves the
    # base from the model path plus the adapter sent at each sync (load_adapter).
    lora_rank: int = 0
    # A VLM's pixel bounds, to which the trainer resized every image it hands over
    # (grpo_trainer.media.images); None for a text model.
    image_bounds: PixelBounds | None = None
    # vLLM's limit_mm_per_prompt for videos (data.max_videos_per_prompt; 0: none, the
    # default), and how the trainer sampled and sized the frames it hands over.
    max_videos_per_prompt: int = 0
    video_spec: VideoSpec | None = None
    # vLLM normalises pixels on the device with the image processor's mean and std, videos'
    # too; False where the video processor's differ (videos.same_normalisation): the host
    # normalises each modality through its own processor instead.
    device_normalize: bool = True


def kv_cache_bytes(hf_config: Any, dtype: torch.dtype, tokens: int, tp: int) -> int:
    """One TP rank's KV cache for ``tokens`` tokens, as the planner counts it
    (grpo_api.model.kv_cache)."""
    config = hf_config.to_dict()  # a VLM's text_config too, as config.json has it
    text = text_fields(config)
    per_token = kv_bytes_per_token(
        int(text["num_hidden_layers"]),
        int(text.get("num_key_value_heads") or text["num_attention_heads"]),
        head_dim(config) or 0, torch.empty((), dtype=dtype).element_size(), tp)
    return engine_kv_cache_bytes(per_token, tokens)


# The process environment every engine gets before vLLM is imported (VLLMEngine: the
# colocated ranks' and the engines apart alike; vLLM reads it lazily, and caches it only
# once an engine core has started, vllm/envs.py enable_envs_cache).
VLLM_ENV = {
    # Deterministic, in-process engine core: the external launcher requires it, and
    # weight reloads then reach the model object without serialising tensors.
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
# Chosen here unless the pod's env (spec.pods) chose otherwise: what a user tries on purpose.
VLLM_ENV_DEFAULTS = {
    # The V1 model runner, on purpose. Unset, vLLM 0.32 picks Model Runner V2 wherever
    # Triton works (vllm/config/vllm.py, VllmConfig.use_v2_model_runner: the env var
    # first, then HAS_TRITON, then V2's unsupported features), i.e. on every GPU, and V1
    # on the CPU build, whose Triton has no CPU backend (triton_utils/importing.py; V2's
    # sampler is Triton kernels, v1/worker/gpu/sample/gumbel.py). The vLLM test tier runs
    # V1 only, so the GPU would otherwise sample, score and reload weights on a runner no
    # test ran (vLLM calls V2 experimental: v1/worker/gpu/README.md); none of V2's own
    # features (context-parallel prefill, DSpark, HiSparse, watermarks) is used here.
    "VLLM_USE_V2_MODEL_RUNNER": "0",
}


def set_vllm_env() -> None:
    """``VLLM_ENV`` and ``VLLM_ENV_DEFAULTS`` into this process's environment."""
    for name, value in VLLM_ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    os.environ.update(VLLM_ENV)


def _distributed_env() -> None:
    """What vLLM's external launcher reads (torchrun would set them)."""
    import torch.distributed as dist

    os.environ["RANK"] = str(dist.get_rank())
    if torch.cuda.is_available():
        # Each Ray actor sees its own GPU(s); vLLM binds cuda:LOCAL_RANK.
        os.environ["LOCAL_RANK"] = str(torch.cuda.current_device())
    else:
        os.environ.setdefault("LOCAL_RANK", str(dist.get_rank()))
    # Any free address: the process group already exists, vLLM only reads these.
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")


def sleep_level(cfg: VLLMEngineConfig) -> int:
    """vLLM's sleep level between rollouts (CUDA with sleep mode only).

    Level 2 discards the weights instead of copying them to host memory and back every
    step: each step's load_weights rewrites all of them anyway. LoRA keeps level 1: only
    the adapters travel, the base weights must survive the sleep."""
    return 1 if cfg.lora_rank else 2


def engine_kwargs(
    cfg: VLLMEngineConfig, *, on_cpu: bool, sleep_mode: bool, distributed: bool
) -> dict[str, Any]:
    """``vllm.LLM``'s arguments for this engine on this platform (pure: CPU tests pin the
    CUDA branch)."""
    if cfg.tensor_parallel_size > 1 and not distributed:
        raise ValueError("tensor_parallel_size > 1 needs the trainer's torch.distributed")
    kwargs: dict[str, Any] = {
        "model": cfg.model_path,
        "dtype": cfg.dtype,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "max_model_len": cfg.max_model_len,
        "max_num_seqs": max(1, cfg.max_num_seqs),
        "seed": cfg.seed,
        "enable_sleep_mode": sleep_mode,
        "trust_remote_code": cfg.trust_remote_code,
        "enable_prefix_caching": False,  # weights change every step
        # One step at a time: what the external launcher's identical schedulers on
        # every TP rank rely on, and what makes seeded runs repeat exactly.
        "async_scheduling": False,
        # Videos only as many as the data has (0 unless data.max_videos_per_prompt opts
        # in): left unset, vLLM allows 999 a prompt, and budgets its encoder cache and
        # runs its start-up encoder profile for whichever modality has the most tokens an
        # item (multimodal/encoder_budget.py:184-188), a video of up to max_model_len.
        "limit_mm_per_prompt": {"image": cfg.max_images_per_prompt,
                                "video": cfg.max_videos_per_prompt},
        # Log-probs after temperature scaling: what the actor recomputes.
        "logprobs_mode": "processed_logprobs",
        # Off unless the process sees its TP peers' GPUs: VLLMEngine decides per process
        # (rollout/collectives.py); the CPU build never has the custom kernel.
        "disable_custom_all_reduce": True,
    }
    if cfg.lora_rank:
        from .engine_limits import vllm_lora_rank

        rank = vllm_lora_rank(cfg.lora_rank)
        kwargs.update(enable_lora=True, max_lora_rank=rank, max_loras=1)
    if cfg.image_bounds is not None:
        # The checkpoint's own limit would otherwise apply (12,845,056 pixels for Qwen2/
        # 2.5-VL): to the images (already resized to these bounds, so this resize leaves
        # them alone) and to the dummy images vLLM profiles its encoder with at start-up.
        kwargs["mm_processor_kwargs"] = dict(cfg.image_bounds.vllm_kwargs)
        # The processor cache keeps every image it saw in host RAM, up to 4 GiB in each
        # of its mirrored halves (renderer and engine core), for reuse by a later
        # request; a rollout sees each image once per epoch, and the next epoch comes
        # long after. Off: no host memory the planner does not count.
        kwargs["mm_processor_cache_gb"] = 0
    if not cfg.device_normalize:
        kwargs["mm_device_do_normalize"] = False
    if cfg.max_videos_per_prompt and cfg.video_spec is not None:
        # The frames come sampled and sized (no resize, no resampling: the frames the
        # update trains on), and the video bounds (the flat ones above are the images'
        # and vLLM routes them to videos too, unless a scoped value says otherwise) size
        # vLLM's encoder budget and start-up profile for the largest video allowed.
        kwargs.setdefault("mm_processor_kwargs", {})["videos_kwargs"] = (
            cfg.video_spec.vllm_kwargs())
    if on_cpu:
        kwargs["kv_cache_memory_bytes"] = cfg.cpu_kv_cache_bytes
        kwargs["enforce_eager"] = True  # no graph capture on CPU
    else:
        kwargs["gpu_memory_utilization"] = cfg.gpu_memory_utilization
        if sleep_mode:
            # CUDA graphs live in their own pool, which a sleep leaves on the GPU unless
            # it is backed up to (pinned) host RAM and restored on wake: 0.5-2 GiB per
            # GPU the update would otherwise not have.
            kwargs["sleep_mode_offload_cudagraph"] = True
    if distributed:
        kwargs["distributed_executor_backend"] = "external_launcher"
    return kwargs


class VLLMEngine:
    def __init__(self, cfg: VLLMEngineConfig) -> None:
        import torch.distributed as dist

        trainer_local_rank = os.environ.get("LOCAL_RANK")  # vLLM's only while it starts
        set_vllm_env()
        from vllm import LLM
        from vllm.platforms import current_platform

        self.on_cpu = bool(current_platform.is_cpu())
        self.sleep_mode = (
            cfg.enable_sleep_mode and not self.on_cpu and current_platform.is_sleep_mode_available()
        )
        self.sleep_level = sleep_level(cfg)
        distributed = dist.is_available() and dist.is_initialized()
        kwargs = engine_kwargs(
            cfg, on_cpu=self.on_cpu, sleep_mode=self.sleep_mode, distributed=distributed
        ) | collective_kwargs(self.on_cpu, cfg.tensor_parallel_size)
        self.adapters = AdapterSlot(cfg.model_path) if cfg.lora_rank else None
        if distributed:
            _distributed_env()
        if self.on_cpu:
            # A killed run's TP segments have the names ours are about to get (EEXIST).
            remove_stale_vllm_segments()
            if distributed:
                # No rank creates its segment while another may still be removing one
                # it judged stale a moment earlier.
                dist.barrier()
        self.llm = LLM(**kwargs)
        restore_local_rank(trainer_local_rank)
        self.asleep = False
        self.sleep()

    def wake(self) -> None:
        if self.sleep_mode and self.asleep:
            self.llm.wake_up(tags=["weights"])

    def sleep(self) -> None:
        # The vision embeddings of this rollout's images: plain torch tensors outside the
        # pool a sleep frees, so they would stay on the GPU through the update (EasyR1
        # 07cae10: under LoRA, never reset, they ran the update out of memory). Before
        # every sleep, whichever path synced the weights; on CPU it frees host memory.
        self.llm.llm_engine.reset_encoder_cache()
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = True

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace every weight in place from a (Hugging Face name, full tensor) stream."""
        self.llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": _owned(weights), "is_checkpoint_format": True},
        )
        # The reload clears the model runner's encoder and multimodal caches; the
        # scheduler's and the input processor's records of them go too, or the next
        # step reuses (or looks for) vision embeddings computed with the old weights:
        # "Encoder cache miss" for an image seen in an earlier step.
        self.llm.llm_engine.reset_encoder_cache()
        self.llm.reset_mm_cache()
        if self.sleep_mode and self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False

    def load_adapter(self, tensors: Mapping[str, torch.Tensor], lora: LoraConfig) -> None:
        """Serve ``tensors`` (the actor's full adapters) from now on; the base weights
        stay as loaded once from the model path. Only the adapters travel."""
        if self.adapters is None:
            raise RuntimeError("load_adapter on an engine built without LoRA (lora_rank 0)")
        self.adapters.replace(self.llm, tensors, lora)
        if self.sleep_mode and self.asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.asleep = False

    def _lora_request(self) -> Any:
        return self.adapters.request if self.adapters is not None else None

    def generate(self, prompts: list[EncodedPrompt], spec: SamplingSpec) -> list[list[Generation]]:
        from vllm import SamplingParams

        seeds = spec.prompt_seeds or tuple(spec.seed + i for i in range(len(prompts)))
        if len(seeds) != len(prompts):
            raise ValueError(f"{len(seeds)} prompt seeds for {len(prompts)} prompts")
        params = [
            SamplingParams(
                n=spec.n,
                temperature=spec.temperature,
                top_p=spec.top_p,
                max_tokens=spec.max_new_tokens,
                logprobs=0,  # the sampled token's log-prob only
                seed=seed,
                logit_bias={i: -100.0 for i in spec.suppress_ids} or None,
            )
            for seed in seeds
        ]
        outputs = self.llm.generate(
            _inputs(prompts), params, use_tqdm=False, lora_request=self._lora_request()
        )
        result: list[list[Generation]] = []
        for prompt, out in zip(prompts, outputs, strict=True):
            _same_prompt(prompt, out)
            gens: list[Generation] = []
            for c in out.outputs:
                ids = list(c.token_ids)
                lps = [_logprob(d, t) for t, d in zip(ids, c.logprobs or [], strict=True)]
                gens.append(
                    Generation(
                        torch.tensor(ids, dtype=torch.long),
                        torch.tensor(lps, dtype=torch.float32),
                        finished=c.finish_reason == "stop",
                    )
                )
            result.append(gens)
        return result

    def score(self, prompts: list[EncodedPrompt], responses: list[list[int]]) -> list[torch.Tensor]:
        """vLLM's log-probs of given response tokens after each prompt (weight-sync checks),
        at temperature 1: they are prompt log-probs, which skip the sampling processors
        whatever the request's temperature (vLLM 0.32 ``GPUModelRunner.
        _get_prompt_logprobs_dict``: ``compute_logprobs`` of the raw logits, "processed_*
        and raw_* yield the same scores here"). Compare them with the actor's at 1."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, logprobs=0)
        outputs = self.llm.generate(
            _inputs(prompts, responses), params, use_tqdm=False, lora_request=self._lora_request()
        )
        scores: list[torch.Tensor] = []
        for prompt, out, resp in zip(prompts, outputs, responses, strict=True):
            _same_prompt(prompt, out, len(resp))
            # prompt_logprobs[i] scores token i of the submitted sequence.
            tail = (out.prompt_logprobs or [])[-len(resp) :] if resp else []
            ids = list(out.prompt_token_ids or [])[-len(resp) :] if resp else []
            scores.append(torch.tensor([_logprob(d, t) for t, d in zip(ids, tail, strict=True)]))
        return scores


def _same_prompt(prompt: EncodedPrompt, out: Any, appended: int = 0) -> None:
    """vLLM expanded the prompt's image placeholders to as many tokens as the trainer's
    processor did: otherwise it sampled from other inputs than the update trains on.
    ``appended``: response tokens submitted after the prompt (``score``)."""
    got = len(out.prompt_token_ids or ()) - appended
    want = int(prompt.input_ids.numel())
    if got != want:
        raise RuntimeError(
            f"{prompt.record.where}: vLLM's prompt has {got} tokens, the trainer's {want} "
            f"({len(prompt.images)} image(s), {len(prompt.videos)} video(s)): the rollout "
            "would sample from other inputs than the update trains on"
        )


def _logprob(entry: dict[int, Any] | None, token: int) -> float:
    if entry is None:
        raise RuntimeError(f"vLLM returned no log-prob for token {token}")
    return float(entry[token].logprob)


def _inputs(prompts: list[EncodedPrompt], responses: list[list[int]] | None = None) -> Any:
    """vLLM's TokensPrompt dicts (typed loosely: the multimodal variants differ by version)."""
    items: list[dict[str, Any]] = []
    for i, p in enumerate(prompts):
        ids = list(p.raw_prompt_ids) + (list(responses[i]) if responses else [])
        item: dict[str, Any] = {"prompt_token_ids": ids}
        data: dict[str, Any] = {}
        if p.images:
            # vLLM expands the single placeholder per image itself.
            data["image"] = p.images
        if p.videos:
            # (frames [T, H, W, 3] uint8, metadata) per video, the form vLLM's Qwen-VL
            # parsers take (Qwen2.5/3-VL require the metadata, Qwen2-VL drops it);
            # do_sample_frames False: the frames are the samples (Qwen3-VL's processor
            # would otherwise sample them again).
            data["video"] = [(v.frames, {**v.metadata(), "do_sample_frames": False})
                             for v in p.videos]
        if data:
            item["multi_modal_data"] = data
        items.append(item)
    return items


def _owned(weights: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Copies of the gathered views, so each bucket's buffer is freed once consumed
    even while vLLM still buffers the tensors of a half-filled layer."""
    for name, t in weights:
        yield name, t.clone()
