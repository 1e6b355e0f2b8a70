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
# turns, images as <|vision_start|><|image_pad|><|vision_end|> placeholders that the
# processor expands to the right number of patch tokens.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
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


def build_tiny_qwen2_5_vl(
    path: str | Path, hidden: int = 64, layers: int = 2, seed: int = 0, vocab_size: int = 400
) -> Path:
    """A random-weight Qwen2_5_VLForConditionalGeneration + tokenizer + processor.

    The image processor is set for small images (28x28 to 56x56 pixels, i.e. 1 to 4
    merged visual tokens) so the vision tower stays cheap on a CPU (``save_vl_processor``).
    """
    import torch
    from transformers import (
        GenerationConfig,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
    )

    path = Path(path)
    tok = build_tokenizer(vocab_size)
    text = _text_dims(hidden, layers, _padded_vocab(tok), tok)
    text["rope_parameters"] = {
        "rope_type": "default",
        "rope_theta": 10000.0,
        # Temporal/height/width split of half the head dim, in Qwen's 2:3:3 ratio.
        "mrope_section": _mrope_section(hidden // text["num_attention_heads"]),
    }
    vision = {
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_heads": 2,
        "out_hidden_size": hidden,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 56,
        "fullatt_block_indexes": [1],
    }
    cfg = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=tok.convert_tokens_to_ids("<|image_pad|>"),
        video_token_id=tok.convert_tokens_to_ids("<|video_pad|>"),
        vision_start_token_id=tok.convert_tokens_to_ids("<|vision_start|>"),
        vision_end_token_id=tok.convert_tokens_to_ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(cfg)
    model.generation_config = GenerationConfig(
        eos_token_id=text["eos_token_id"], pad_token_id=text["pad_token_id"]
    )
    model.save_pretrained(path, safe_serialization=True)
    save_vl_processor(path, tok)
    return path


def save_vl_processor(
    path: Path, tok: Any, min_pixels: int = 28 * 28, max_pixels: int = 56 * 56
) -> None:
    """Qwen2.5-VL's processor around ``tok`` (14-pixel patches, 2 x 2 merged), for images
    of ``min_pixels`` to ``max_pixels``, and the tokenizer, saved to ``path``."""
    from transformers import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    size = {"shortest_edge": min_pixels, "longest_edge": max_pixels}
    image_processor = Qwen2VLImageProcessor(
        size=size, patch_size=14, merge_size=2, temporal_patch_size=2
    )
    processor = Qwen2_5_VLProcessor(
        image_processor=image_processor,
        tokenizer=tok,
        video_processor=Qwen2VLVideoProcessor(size=size),
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(path)
    tok.save_pretrained(path)
