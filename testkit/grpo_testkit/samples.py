"""Rollout samples for the update's tests: random response tokens after encoded prompts."""

from __future__ import annotations

from typing import Any

import torch

from grpo_trainer.algorithm.samples import Sample


def random_samples(prompts: list[Any], lengths: list[list[int]], seed: int = 0) -> list[Sample]:
    """Each prompt's samples with responses of ``lengths`` tokens (ids from 10 up: the
    special tokens, the image pad among them, are below), in order; a group's samples
    share their encoded prompt, as a rollout leaves them."""
    gen = torch.Generator().manual_seed(seed)
    return [
        Sample(p, torch.randint(10, 300, (n,), generator=gen), torch.zeros(n), True)
        for p, ns in zip(prompts, lengths, strict=True)
        for n in ns
    ]


def text_prompts(model_dir: Any) -> tuple[list[Any], int]:
    """Three math prompts of very different lengths, encoded as the trainer encodes them
    for the tiny model at ``model_dir``, and its pad id."""
    from transformers import AutoTokenizer

    from grpo_trainer.algorithm.samples import PromptEncoder
    from grpo_trainer.data import Record, load_template

    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = PromptEncoder(None, tok, load_template("math"), None)
    prompts = [
        enc.encode(Record(0, "Say the number 7 please", "7")),
        enc.encode(Record(1, "Count to three, slowly and carefully, then stop.", "3")),
        enc.encode(Record(2, "Hi", "1")),
    ]
    return prompts, int(tok.pad_token_id)


def vl_prompts(model_dir: Any, images: int) -> tuple[list[Any], int]:
    """Two image prompts of different lengths (``images`` images each, of two sizes, in
    another order in the second) and a text-only one, as the trainer encodes them."""
    from transformers import AutoProcessor, AutoTokenizer

    from grpo_trainer.algorithm.samples import PromptEncoder
    from grpo_trainer.data import Record, load_template

    from .datasets import png

    tok = AutoTokenizer.from_pretrained(model_dir)
    enc = PromptEncoder(AutoProcessor.from_pretrained(model_dir), tok, load_template("r1v"),
                        None)
    pics = [png((200, 30, 30), (44, 36)), png((0, 90, 30), (64, 60))][:images]
    prompts = [
        enc.encode(Record(0, "<image>" * images + "How many shapes?", "3", images=pics)),
        enc.encode(Record(1, "<image>" * images + "Count them, slowly and carefully.", "2",
                          images=pics[::-1])),
        enc.encode(Record(2, "No picture here: say 7", "7")),
    ]
    return prompts, int(tok.pad_token_id)
