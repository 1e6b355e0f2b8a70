"""Tiny but real models for tests, demos, benchmarks and `grpo-train make-tiny`, built
offline.

The weights are random, the architectures are the real transformers classes
(Qwen2 causal LM, Qwen2.5-VL), the tokenizer is a real fast tokenizer trained
here with Qwen's special tokens and a chat template, and everything is written
with ``save_pretrained`` as safetensors, so the trainer loads them through the
same path as a downloaded checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]

# Qwen2-VL's chat template reduced to what the trainer uses: system/user/assistant
# turns, images as <|vision_start|><|image_pad|><|vision_end|> placeholders and videos as
# <|vision_start|><|video_pad|><|vision_end|> ones (as Qwen's own templates place them),
# which the processor expands to the right number of patch tokens.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif content['type'] == 'text' %}{{ content['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS_WORDS = [
    "the",
    "answer",
    "is",
    "think",
    "about",
    "it",
    "step",
    "by",
    "step",
    "first",
    "then",
    "final",
    "boxed",
    "yes",
    "no",
    "what",
    "how",
    "many",
    "apples",
    "left",
    "right",
    "red",
    "blue",
    "green",
    "shape",
    "circle",
    "square",
    "triangle",
    "image",
    "picture",
    "shows",
    "count",
    "add",
    "plus",
    "minus",
    "times",
    "equals",
    "solve",
    "problem",
    "question",
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
    "\\boxed{",
    "}",
    "0",
    "1",
    "2",
    "3",
    "4",
    "5",
    "6",
    "7",
    "8",
    "9",
    "10",
    "11",
    "12",
]


def _corpus() -> list[str]:
    lines = [" ".join(_CORPUS_WORDS[i : i + 7]) for i in range(0, len(_CORPUS_WORDS), 3)]
    lines += [
        f"What is {a} plus {b}? The answer is \\boxed{{{a + b}}}"
        for a in range(10)
        for b in range(4)
    ]
    lines += ["<think> count then add </think> <answer> 3 </answer>"] * 5
    return lines * 4


def build_tokenizer(vocab_size: int = 400) -> Any:
    """A byte-level BPE fast tokenizer with Qwen's special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def _text_dims(hidden: int, layers: int, vocab: int, tok: Any) -> dict[str, Any]:
    return {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": hidden * 2,
        "num_hidden_layers": layers,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": False,
        "bos_token_id": tok.convert_tokens_to_ids("<|endoftext|>"),
        "eos_token_id": tok.convert_tokens_to_ids("<|im_end|>"),
        "pad_token_id": tok.convert_tokens_to_ids("<|endoftext|>"),
    }


def _padded_vocab(tok: Any) -> int:
    # Round up like real checkpoints do, so embedding rows exceed the tokenizer's
    # vocabulary and the trainer must cope with that.
    return (len(tok) + 63) // 64 * 64


def build_tiny_qwen2(
    path: str | Path,
    hidden: int = 64,
    layers: int = 2,
    seed: int = 0,
    vocab_size: int = 400,
    init_std: float = 0.02,
) -> Path:
    """A random-weight Qwen2ForCausalLM plus tokenizer, saved to ``path``.

    ``init_std``: the weights' scale. At 0.02 (transformers' default) the frozen LM head
    of a 64-wide model can move a token's logit by about one nat at most, so a LoRA
    run (which leaves the head alone) cannot learn the text task; 0.1 leaves room.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    path = Path(path)
    tok = build_tokenizer(vocab_size)
    dims = _text_dims(hidden, layers, _padded_vocab(tok), tok)
    cfg = Qwen2Config(**dims, initializer_range=init_std)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.generation_config = GenerationConfig(
        eos_token_id=cfg.eos_token_id, pad_token_id=cfg.pad_token_id
    )
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path


def _mrope_section(head_dim: int) -> list[int]:
    half = head_dim // 2
    t = half // 4
    h = (half - t) // 2
    return [t, h, half - t - h]


# The VLM families the trainer trains, tiny: each one's vision tower and how its
# processor cuts images (patch side; 2 x 2 patches merge into one token in all three).
VL_FAMILIES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
_VL_PATCH = {"qwen2_vl": 14, "qwen2_5_vl": 14, "qwen3_vl": 16}


def _vision_config(family: str, hidden: int) -> dict[str, Any]:
    common = {"num_heads": 2, "patch_size": _VL_PATCH[family], "spatial_merge_size": 2,
              "temporal_patch_size": 2}
    if family == "qwen2_vl":  # embed_dim is the tower's width, hidden_size its output
        return {**common, "depth": 2, "embed_dim": 32, "hidden_size": hidden, "mlp_ratio": 2}
    if family == "qwen2_5_vl":
        return {**common, "depth": 2, "hidden_size": 32, "intermediate_size": 64,
                "out_hidden_size": hidden, "window_size": 56, "fullatt_block_indexes": [1]}
    # Qwen3-VL: learned position embeddings (an 8 x 8 grid, interpolated to the image)
    # and one deepstack merger, whose features join the first decoder layer.
    return {**common, "depth": 2, "hidden_size": 32, "intermediate_size": 64,
            "out_hidden_size": hidden, "num_position_embeddings": 64,
            "deepstack_visual_indexes": [0]}


def build_tiny_vl(
    path: str | Path, family: str = "qwen2_5_vl", hidden: int = 64, layers: int = 2,
    seed: int = 0, vocab_size: int = 400, max_pixels: int | None = None,
) -> Path:
    """A random-weight ``family`` VLM (``VL_FAMILIES``: Qwen2-VL, Qwen2.5-VL, Qwen3-VL
    ForConditionalGeneration) + tokenizer + processor.

    The image processor is set for small images (28x28 to 56x56 pixels, i.e. 1 to 4
    merged visual tokens at 14-pixel patches; 32x32 to 64x64 at Qwen3-VL's 16) so the
    vision tower stays cheap on a CPU (``save_vl_processor``), or up to ``max_pixels``.
    """
    import torch
    import transformers
    from transformers import GenerationConfig

    config_cls, model_cls = {
        "qwen2_vl": ("Qwen2VLConfig", "Qwen2VLForConditionalGeneration"),
        "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration"),
        "qwen3_vl": ("Qwen3VLConfig", "Qwen3VLForConditionalGeneration"),
    }[family]
    path = Path(path)
    tok = build_tokenizer(vocab_size)
    text = _text_dims(hidden, layers, _padded_vocab(tok), tok)
    head_dim = hidden // text["num_attention_heads"]
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        # Temporal/height/width split of half the head dim, in Qwen's 2:3:3 ratio.
        "mrope_section": _mrope_section(head_dim),
    }
    if family == "qwen3_vl":  # Qwen3's head_dim is its own field (128 by default)
        text["head_dim"] = head_dim
        text["rope_parameters"]["mrope_interleaved"] = True
    cfg = getattr(transformers, config_cls)(
        text_config=text,
        vision_config=_vision_config(family, hidden),
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(cfg)
    model.generation_config = GenerationConfig(
        eos_token_id=text["eos_token_id"], pad_token_id=text["pad_token_id"]
    )
    model.save_pretrained(path, safe_serialization=True)
    patch = _VL_PATCH[family]
    save_vl_processor(path, tok, (2 * patch) ** 2, max_pixels or (4 * patch) ** 2, family)
    return path


def build_tiny_qwen2_5_vl(
    path: str | Path, hidden: int = 64, layers: int = 2, seed: int = 0, vocab_size: int = 400
) -> Path:
    """A random-weight Qwen2_5_VLForConditionalGeneration + tokenizer + processor
    (``build_tiny_vl``)."""
    return build_tiny_vl(path, "qwen2_5_vl", hidden, layers, seed, vocab_size)


def save_vl_processor(
    path: Path, tok: Any, min_pixels: int = 28 * 28, max_pixels: int = 56 * 56,
    family: str = "qwen2_5_vl",
) -> None:
    """``family``'s processor around ``tok`` (its patch side, 2 x 2 merged), for images
    of ``min_pixels`` to ``max_pixels``, and the tokenizer, saved to ``path``."""
    import transformers
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    patch = _VL_PATCH[family]
    image_processor = Qwen2VLImageProcessor(
        size=size, patch_size=patch, merge_size=2, temporal_patch_size=2
    )
    processor_cls, video_cls = {
        "qwen2_vl": ("Qwen2VLProcessor", "Qwen2VLVideoProcessor"),
        "qwen2_5_vl": ("Qwen2_5_VLProcessor", "Qwen2VLVideoProcessor"),
        "qwen3_vl": ("Qwen3VLProcessor", "Qwen3VLVideoProcessor"),
    }[family]
    video = getattr(transformers, video_cls)(size=size, patch_size=patch)
    processor = getattr(transformers, processor_cls)(
        image_processor=image_processor,
        tokenizer=tok,
        video_processor=video,
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(path)
    tok.save_pretrained(path)
