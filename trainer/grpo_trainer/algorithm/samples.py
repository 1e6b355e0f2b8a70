"""Encoded prompts, rollout samples, and the generation and padded training collations
(the shared-prefix one is packing.py).

Multimodal inputs stay generic: processor outputs shaped like ``input_ids``
(e.g. Qwen's ``mm_token_type_ids``) are padded along with the tokens, everything
else (``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw``,
Qwen2.5-VL's ``second_per_grid_ts``) is concatenated along dim 0 in sample order, which
is the layout Qwen-VL models expect for a batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from grpo_api.trainer_config import Config

from ..data import Record, build_messages, decode_images, load_template
from ..media.images import PixelBounds, image_size, pixel_bounds, processor_bounds
from ..media.videos import Video, VideoShape, VideoSpec, load, metadata_object, probe, timestamps_of
from ..media.videos import video_spec as make_video_spec


@dataclass
class EncodedPrompt:
    record: Record
    input_ids: torch.Tensor  # [L] with image placeholders expanded
    token_extras: dict[str, torch.Tensor] = field(default_factory=dict)  # [L] each
    mm_inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # concatenable on dim 0
    raw_prompt_ids: list[int] = field(default_factory=list)  # placeholders unexpanded (vLLM)
    images: list[Any] = field(default_factory=list)  # PIL images (vLLM)
    # The sampled, resized frames the processor encoded, and their metadata (vLLM).
    videos: list[Video] = field(default_factory=list)


@dataclass
class Sample:
    """One generation: a prompt, its response, and everything the update needs."""

    prompt: EncodedPrompt
    response_ids: torch.Tensor  # [R], up to and including EOS when it finished
    # [R] from the rollout engine: the behaviour policy of an off-policy sample
    # (offpolicy.py), else only compared with the actor (logprob_abs_diff_mean)
    rollout_log_probs: torch.Tensor
    finished: bool
    text: str = ""
    old_log_probs: torch.Tensor | None = None  # recomputed by the actor
    ref_log_probs: torch.Tensor | None = None
    advantage: float = 0.0
    # [3, P + R]: the model's M-RoPE positions of prompt + response, computed once
    # (packing.rope_index_of) for every pass of the update that packs it.
    rope_positions: torch.Tensor | None = None
    # The policy version (updates applied) whose weights drew it: a disaggregated
    # engine's; None: the policy being updated (colocated rollouts).
    policy_version: int | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.prompt.input_ids.numel() + self.response_ids.numel())


class PromptEncoder:
    """Chat template + processor, identical for rollout and training. Each image is
    resized once to ``bounds`` (grpo_trainer.media.images), each video sampled and resized once
    to ``video_spec`` (grpo_trainer.media.videos), and those pixels are what both the processor
    and the rollout engine get."""

    def __init__(
        self, processor: Any, tokenizer: Any, template: Any, bounds: PixelBounds | None,
        video_spec: VideoSpec | None = None,
    ) -> None:
        self.processor = processor
        self.tokenizer = tokenizer
        self.template = template
        # None: the processor's own (a VLM), or none at all (a text model).
        self.bounds = bounds
        if bounds is None and processor is not None:
            self.bounds = processor_bounds(processor.image_processor)
        # None: data.video_*'s defaults for a VLM with a video processor, else no videos.
        self.video_spec = video_spec
        if video_spec is None and getattr(processor, "video_processor", None) is not None:
            self.video_spec = make_video_spec(None, processor.video_processor,
                                              writes_timestamps(processor))

    def _prompt(self, record: Record) -> tuple[str, list[int]]:
        """The templated prompt and its tokens, one placeholder per image (what vLLM is
        given; the processor expands each placeholder to the image's tokens)."""
        messages = build_messages(record, self.template)
        text = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        return text, list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _bounds(self) -> PixelBounds:
        if self.bounds is None:
            raise ValueError("the model has no image processor but the data has images")
        return self.bounds

    def _video_spec(self) -> VideoSpec:
        if self.video_spec is None:
            raise ValueError("the model has no video processor but the data has videos")
        return self.video_spec

    def _video_tokens(self, shape: VideoShape, spec: VideoSpec) -> int:
        """The tokens one video's placeholder becomes: its frames' tokens, and for
        Qwen3-VL each temporal patch's ``<t seconds>`` text and vision start/end tokens
        (``Qwen3VLProcessor.replace_video_token``; vLLM's ``get_video_repl`` the same).
        Each time is tokenized on its own: special tokens bound it in the prompt."""
        tokens = shape.tokens(spec)
        if not spec.timestamps:
            return tokens
        times = timestamps_of(shape.indices, shape.fps, spec.temporal_patch)
        text = sum(len(self.tokenizer(f"<{t:.1f} seconds>", add_special_tokens=False)
                       ["input_ids"]) for t in times)
        return tokens + text + 2 * len(times)

    def count_tokens(self, record: Record) -> int:
        """``encode(record).input_ids.numel()`` without running the processor: each image's
        placeholder becomes ``PixelBounds.tokens`` of its size, read from its header; each
        video's its frames' tokens, the frame count and size read from its header
        (``videos.probe``: nothing decoded)."""
        raw = len(self._prompt(record)[1])
        if record.images:
            bounds = self._bounds()
            raw += sum(bounds.tokens(*image_size(b)) - 1 for b in record.images)
        if record.videos:
            spec = self._video_spec()
            raw += sum(self._video_tokens(probe(v, spec), spec) - 1 for v in record.videos)
        return raw

    def encode(self, record: Record) -> EncodedPrompt:
        text, raw_ids = self._prompt(record)
        if not record.images and not record.videos:
            ids = torch.tensor(raw_ids, dtype=torch.long)
            return EncodedPrompt(record, ids, raw_prompt_ids=raw_ids)
        kwargs: dict[str, Any] = {}
        images: list[Any] = []
        if record.images:
            bounds = self._bounds()
            images = [bounds.fit(im) for im in decode_images(record.images)]
            kwargs.update(images=images, size=bounds.processor_size)
        videos: list[Video] = []
        if record.videos:
            spec = self._video_spec()
            videos = [load(v, spec) for v in record.videos]
            # The videos' own kwargs (the flat size is the images' bounds; with do_resize
            # off it leaves the frames as they are).
            kwargs.update(videos=[v.frames for v in videos], videos_kwargs={
                **spec.processor_kwargs,
                "video_metadata": [metadata_object(v) for v in videos]})
        enc = self.processor(text=[text], return_tensors="pt", **kwargs)
        ids = enc["input_ids"][0]
        extras: dict[str, torch.Tensor] = {}
        mm: dict[str, torch.Tensor] = {}
        for key, value in enc.items():
            if key in ("input_ids", "attention_mask") or not isinstance(value, torch.Tensor):
                continue
            if value.dim() == 2 and value.shape == enc["input_ids"].shape:
                extras[key] = value[0]
            else:
                mm[key] = value
        return EncodedPrompt(record, ids, extras, mm, raw_ids, images, videos)


def writes_timestamps(processor: Any) -> bool:
    """Whether ``processor`` writes Qwen3-VL's ``<t seconds>`` before each frame pair of a
    video (Qwen3VLProcessor and what derives from it compute them in
    ``_calculate_timestamps``; Qwen2/2.5-VL's do not)."""
    return hasattr(type(processor), "_calculate_timestamps")


@dataclass(frozen=True)
class RolloutTokens:
    """The tokenizer's side of a rank's rollout: the prompt encoder, the pad id, the ids
    that end a response and the ids never sampled."""

    tokenizer: Any
    encoder: PromptEncoder
    pad_id: int
    eos_ids: list[int]
    # Image/video placeholders: never sampled (SamplingSpec.suppress_ids).
    suppress_ids: tuple[int, ...]


def load_rollout_tokens(cfg: Config, hf_config: Any) -> RolloutTokens:
    """The tokenizer (and, for a VLM, the processor) of ``cfg.model``; ``hf_config`` is
    the loaded model's config, whose EOS and vision token ids win over the tokenizer's."""
    from transformers import AutoProcessor, AutoTokenizer

    tok_path = cfg.model.tokenizer_path or cfg.model.path
    tokenizer = AutoTokenizer.from_pretrained(
        tok_path, trust_remote_code=cfg.model.trust_remote_code
    )
    processor = None
    if getattr(hf_config, "vision_config", None) is not None:
        processor = AutoProcessor.from_pretrained(
            tok_path, trust_remote_code=cfg.model.trust_remote_code
        )
    bounds = pixel_bounds(cfg.data, processor.image_processor) if processor else None
    videos = None
    if (video_processor := getattr(processor, "video_processor", None)) is not None:
        videos = make_video_spec(cfg.data, video_processor, writes_timestamps(processor))
    encoder = PromptEncoder(processor, tokenizer, load_template(cfg.data.format_prompt), bounds,
                            videos)
    eos = getattr(hf_config, "eos_token_id", None)
    if eos is None:  # VLM configs keep it on the text sub-config
        eos = getattr(getattr(hf_config, "text_config", None), "eos_token_id", None)
    if eos is None:
        eos = tokenizer.eos_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]
    vision_keys = (
        "image_token_id",
        "video_token_id",
        "vision_start_token_id",
        "vision_end_token_id",
    )
    return RolloutTokens(
        tokenizer=tokenizer,
        encoder=encoder,
        pad_id=int(tokenizer.pad_token_id),
        eos_ids=[int(e) for e in eos_ids],
        suppress_ids=tuple(
            int(v) for k in vision_keys if (v := getattr(hf_config, k, None)) is not None
        ),
    )


def prompt_token_counter(cfg: Config) -> Callable[[Record], int]:
    """A prompt's length in tokens as the ranks will encode it (``count_tokens``), for the
    driver's check of ``data.max_prompt_length`` when it loads the data."""
    from transformers import AutoConfig

    hf_config = AutoConfig.from_pretrained(
        cfg.model.path, trust_remote_code=cfg.model.trust_remote_code
    )
    return load_rollout_tokens(cfg, hf_config).encoder.count_tokens


def concat_mm(prompts: list[EncodedPrompt]) -> dict[str, torch.Tensor]:
    keys = sorted({k for p in prompts for k in p.mm_inputs})
    return {k: torch.cat([p.mm_inputs[k] for p in prompts if k in p.mm_inputs]) for k in keys}


def collate_prompts(prompts: list[EncodedPrompt], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-padded prompt batch for ``generate``."""
    width = max(p.input_ids.numel() for p in prompts)
    b = len(prompts)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    extra_keys = sorted({k for p in prompts for k in p.token_extras})
    extras = {k: torch.zeros((b, width), dtype=torch.long) for k in extra_keys}
    for i, p in enumerate(prompts):
        n = p.input_ids.numel()
        ids[i, width - n :] = p.input_ids
        mask[i, width - n :] = 1
        for k in extra_keys:
            if k in p.token_extras:
                extras[k][i, width - n :] = p.token_extras[k]
    return {"input_ids": ids, "attention_mask": mask, **extras, **concat_mm(prompts)}


@dataclass
class TrainBatch:
    """A training forward's inputs and where each sample's response tokens land.

    Per-token tensors (``labels``, ``response_mask``, and what ``scatter`` builds) are
    ``[rows, T]``; sample ``i``'s response tokens are ``[row, start : start + n]`` of
    ``positions[i] = (row, start, n)``. ``logit_index`` is None when ``rows, T`` are the
    forward's own batch and shifted sequence (``logits[:, :-1]``); otherwise it picks
    the ``T`` logit positions, flattened over the forward's ``[B, L]``, into one row.
    """

    # Tensors, and a packed batch's SegmentLayout (which moves with ``.to`` as they do).
    model_inputs: dict[str, Any]
    labels: torch.Tensor  # [rows, T] next-token targets
    response_mask: torch.Tensor  # [rows, T] 1 where the target is a response token
    positions: list[tuple[int, int, int]]  # per sample: (row, start, length)
    logit_index: torch.Tensor | None = None  # [T] flat indices into the forward's [B, L]

    def response_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """The forward's ``[B, L, V]`` logits as ``[rows, T, V]``, aligned with ``labels``."""
        if self.logit_index is None:
            return logits[:, :-1]
        flat = logits.reshape(-1, logits.shape[-1])
        return flat.index_select(0, self.logit_index.to(logits.device)).unsqueeze(0)

    def scatter(self, per_sample: list[torch.Tensor]) -> torch.Tensor:
        """Place per-sample response tensors into the ``[rows, T]`` layout."""
        out = torch.zeros(self.labels.shape, dtype=torch.float32)
        for (row, start, n), values in zip(self.positions, per_sample, strict=True):
            out[row, start : start + n] = values.float()
        return out

    def gather(self, values: torch.Tensor) -> list[torch.Tensor]:
        """Inverse of scatter: per-sample response slices of a ``[rows, T]`` tensor."""
        return [values[row, start : start + n] for row, start, n in self.positions]


def collate_train(samples: list[Sample], pad_id: int) -> TrainBatch:
    """Right padding: position ids then equal plain offsets, as generation computed them
    from its left-padded attention mask, so recomputed log-probs line up."""
    lens = [s.num_tokens for s in samples]
    width = max(lens)
    b = len(samples)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    mask = torch.zeros((b, width), dtype=torch.long)
    extra_keys = sorted({k for s in samples for k in s.prompt.token_extras})
    extras = {k: torch.zeros((b, width), dtype=torch.long) for k in extra_keys}
    positions: list[tuple[int, int, int]] = []
    for i, s in enumerate(samples):
        p = s.prompt.input_ids.numel()
        r = s.response_ids.numel()
        ids[i, :p] = s.prompt.input_ids
        ids[i, p : p + r] = s.response_ids
        mask[i, : p + r] = 1
        for k in extra_keys:
            if k in s.prompt.token_extras:
                extras[k][i, :p] = s.prompt.token_extras[k]
        positions.append((i, p - 1, r))
    labels = ids[:, 1:].clone()
    resp = torch.zeros((b, width - 1), dtype=torch.float32)
    for row, start, n in positions:
        resp[row, start : start + n] = 1.0
    inputs = {
        "input_ids": ids,
        "attention_mask": mask,
        **extras,
        **concat_mm([s.prompt for s in samples]),
    }
    return TrainBatch(inputs, labels, resp, positions)


def summary(s: Sample) -> dict[str, Any]:
    """What the driver sees of a sample: rewards, balancing and metrics need no tensors."""
    return {
        "index": s.prompt.record.index,
        "text": s.text,
        "prompt_tokens": int(s.prompt.input_ids.numel()),
        "response_tokens": int(s.response_ids.numel()),
        "finished": s.finished,
    }
