"""Prompt data: EasyR1-layout parquet/jsonl, Jinja2 prompt templates, a seeded stateful loader.

Rows have ``problem`` (text, may contain ``<image>`` markers), ``answer`` and
optionally ``images`` (a list of encoded bytes, paths, or ``{"bytes", "path"}``
dicts as Hugging Face datasets store them), at most ``data.max_images_per_prompt`` of
them. The loader yields whole batches in a
seeded per-epoch order and exposes its position via ``state_dict`` so a resumed
run continues with the very next batch.
"""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import numpy as np

from grpo_api.job.trainer import config_sources
from grpo_api.trainer_config import MAX_IMAGES_PER_PROMPT, Config, DataConfig

from .config_error import ConfigError

log = logging.getLogger(__name__)
# Overlong prompts named one by one in the drop message; the rest are counted.
MAX_NAMED = 20

# Our wording of the common reasoning formats (EasyR1 math / R1-V style).
BUILTIN_TEMPLATE_TEXT = {
    "plain": "{{ content | trim }}",
    "math": (
        "{{ content | trim }} First reason about the problem step by step inside "
        "<think> </think> tags, then give the final answer in \\boxed{}."
    ),
    "r1v": (
        "{{ content | trim }} Think it through inside <think> </think> tags, then write "
        "the final answer inside <answer> </answer> tags."
    ),
}


@dataclass
class Record:
    """One prompt row as the driver sends it to a worker."""

    index: int
    problem: str
    answer: str
    images: list[bytes] = field(default_factory=list)
    # Each video: a video file's absolute path, or its frames' encoded bytes in order
    # (decoded and sampled where the prompt is encoded: grpo_trainer.videos).
    videos: list[str | list[bytes]] = field(default_factory=list)
    source: str = ""  # the file it was read from (messages name it)
    row: int = 0  # its row in that file, from 0

    @property
    def where(self) -> str:
        return f"{self.source} row {self.row}" if self.source else f"prompt {self.index}"


# Where a split's parquet files sit in a hub dataset (the Hugging Face / EasyR1 layout,
# e.g. hiyouga/geometry3k: data/train-00000-of-00001.parquet), most specific first.
SPLIT_GLOBS = ("data/{split}-*.parquet", "data/{split}.parquet", "{split}-*.parquet",
               "{split}.parquet", "{split}/*.parquet", "**/{split}-*.parquet")


def data_files(entry: str, field: str = "data.train_files") -> list[Path]:
    """The files of one data entry: a parquet/jsonl file, or `<dir>@<split>` for a hub
    dataset fetched onto the volume (its parquet files for that split). ``field`` names
    the config entry in errors."""
    base, _, split = entry.rpartition("@")
    if not (base and Path(base).is_dir()):
        return [Path(entry)]
    for pattern in SPLIT_GLOBS:
        found = sorted(Path(base).glob(pattern.format(split=split)))
        if found:
            return found
    raise ConfigError(field, f"{base} has no parquet files for split {split!r} "
                      f"(looked for {', '.join(g.format(split=split) for g in SPLIT_GLOBS)})")


def _read_rows(path: Path, field: str) -> list[dict[str, Any]]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return list(pq.read_table(path).to_pylist())
    if path.suffix in (".jsonl", ".json"):
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    raise ConfigError(field, f"unsupported file type {path.suffix!r} (parquet, jsonl)")


def _image_bytes(item: Any, base: Path) -> bytes:
    if isinstance(item, dict):
        if item.get("bytes"):
            return bytes(item["bytes"])
        item = item.get("path")
    if isinstance(item, bytes | bytearray):
        return bytes(item)
    if isinstance(item, str):
        p = Path(item)
        return (p if p.is_absolute() else base / p).read_bytes()
    raise ValueError(f"cannot read an image from {type(item).__name__}")


class PromptDataset:
    """Every row of ``files`` with at most ``data.max_images_per_prompt`` images
    (``limit_images``); with ``prompt_tokens`` (a prompt's length in tokens, image tokens
    included), those longer than ``data.max_prompt_length`` are dropped or refused
    (``limit_prompt_lengths``)."""

    def __init__(
        self,
        files: list[str],
        cfg: DataConfig,
        field: str = "data.train_files",
        prompt_tokens: Callable[[Record], int] | None = None,
    ) -> None:
        self.cfg = cfg
        self.records: list[Record] = []
        for path in (p for f in files for p in data_files(f, field)):
            for i, row in enumerate(_read_rows(path, field)):
                missing = [k for k in (cfg.prompt_key, cfg.answer_key) if k not in row]
                if missing:
                    raise ConfigError("data.prompt_key", f"{path} lacks column(s) {missing}")
                imgs = row.get(cfg.image_key) or []
                self.records.append(
                    Record(
                        index=len(self.records),
                        problem=str(row[cfg.prompt_key]),
                        answer=str(row[cfg.answer_key]),
                        images=[_image_bytes(i, path.parent) for i in imgs],
                        source=str(path),
                        row=i,
                    )
                )
        if not self.records:
            raise ConfigError(field, "no rows found")
        self.records = limit_images(self.records, cfg, field)
        if prompt_tokens is not None:
            self.records = limit_prompt_lengths(self.records, prompt_tokens, cfg, field)

    def __len__(self) -> int:
        return len(self.records)


def limit_images(records: list[Record], cfg: DataConfig, field: str) -> list[Record]:
    """The records with at most ``data.max_images_per_prompt`` images. vLLM refuses a
    prompt with more than its ``limit_mm_per_prompt`` at ``generate`` ("At most 4 image(s)
    may be provided in one prompt"), failing the whole TP group's rollout, and the batch
    comes back on resume; the planner sizes a prompt's vision activations by the same
    maximum. A row with more is left out or refused as an overlong prompt is."""
    cap = cfg.max_images_per_prompt

    def problem(r: Record) -> str | None:
        if len(r.images) <= cap:
            return None
        return (f"{r.where}: the prompt has {len(r.images)} images, more than the {cap} of "
                f"{_setting('max_images_per_prompt')} (at most {MAX_IMAGES_PER_PROMPT})")

    return _keep(records, problem, cfg, field, "data.max_images_per_prompt",
                 f"raise it (at most {MAX_IMAGES_PER_PROMPT}) or split the row",
                 "has too many images")


def limit_prompt_lengths(
    records: list[Record], prompt_tokens: Callable[[Record], int], cfg: DataConfig, field: str
) -> list[Record]:
    """The records whose prompts fit ``data.max_prompt_length``. A longer one is left out
    (``data.overlong_prompts: drop``, logged) or refused (``fail``: a ConfigError); both
    messages name the file, the row, both lengths and the setting. vLLM's context is the
    prompt limit plus the response limit, so a longer prompt would fail its ``generate``
    for the whole TP group, and the update would train on a truncated one."""
    limit = cfg.max_prompt_length

    def problem(r: Record) -> str | None:
        try:
            n = prompt_tokens(r)
        except ConfigError as err:  # pixel bounds no image size satisfies
            raise ConfigError(err.field, f"{r.where}: {err.message}") from err
        except ValueError as err:  # e.g. smart-resize refuses an aspect ratio over 200
            raise ConfigError(field, f"{r.where}: {err}") from err
        return None if n <= limit else overlong(r, n, limit)

    return _keep(records, problem, cfg, field, "data.max_prompt_length", "raise it",
                 "is too long")


def _keep(records: list[Record], problem: Callable[[Record], str | None], cfg: DataConfig,
          field: str, limit_field: str, fix: str, what: str) -> list[Record]:
    """The records without a ``problem``; one with is dropped (logged, the first
    MAX_NAMED by name) or, with ``data.overlong_prompts: fail``, refused naming
    ``limit_field`` and the ``fix``. No record left is a ConfigError on ``field``."""
    kept: list[Record] = []
    over: list[str] = []
    for r in records:
        where = problem(r)
        if where is None:
            kept.append(r)
            continue
        if cfg.overlong_prompts == "fail":
            raise ConfigError(
                limit_field,
                f"{where}; {fix}, or set {_setting('overlong_prompts')} to drop to leave "
                "such prompts out",
            )
        over.append(where)
    if over:
        log.warning(
            "dropped %d of %d prompts of %s (%s: drop): %s", len(over), len(records), field,
            _setting("overlong_prompts"), "; ".join(over[:MAX_NAMED]) +
            (f"; and {len(over) - MAX_NAMED} more" if len(over) > MAX_NAMED else ""),
        )
    if not kept:
        raise ConfigError(field, f"every prompt {what}: {over[0]}")
    return kept


def most_images(*datasets: list[Record]) -> int:
    """The most images any prompt of ``datasets`` has (its images column: ``<image>``
    markers only place them, build_messages)."""
    return max((len(r.images) for records in datasets for r in records), default=0)


def sized_for_images(cfg: Config, *datasets: list[Record]) -> Config:
    """``cfg`` with ``data.max_images_per_prompt`` lowered to the most images a loaded
    prompt has (at least 1: vLLM then still builds and profiles the vision tower, which
    every weight sync writes). What the ranks' and engines' vLLM is sized by
    (rollout/build.py ``vllm_config``); the rows were limited to the setting at load."""
    most = max(1, min(cfg.data.max_images_per_prompt, most_images(*datasets)))
    return cfg.model_copy(update={"data": cfg.data.model_copy(
        update={"max_images_per_prompt": most})})


def overlong(record: Record, tokens: int, limit: int) -> str:
    """Where a prompt is and how much too long."""
    return (f"{record.where}: the prompt has {tokens} tokens, more than the {limit} of "
            f"{_setting('max_prompt_length')}")


def _setting(key: str) -> str:
    """``data.<key>`` with the GRPOJob field that sets it, for messages."""
    path = f"data.{key}"
    return f"{path} ({config_sources()[path]})"


class StatefulLoader:
    """Endless batches over a dataset; each epoch is a fresh seeded permutation.

    Drops the tail of an epoch that does not fill a batch, so every step sees the
    same number of prompts. The state is three integers, cheap to checkpoint.
    """

    def __init__(self, dataset: PromptDataset, batch_size: int, seed: int, shuffle: bool) -> None:
        if batch_size > len(dataset):
            raise ConfigError(
                "trainer.rollout_batch_size",
                f"{batch_size} prompts per step but the dataset has only {len(dataset)}",
            )
        self.dataset = dataset
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.offset = 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        return np.random.default_rng([self.seed, epoch]).permutation(n)

    def next_batch(self) -> list[Record]:
        if self.offset + self.batch_size > len(self._order):
            self.epoch += 1
            self.offset = 0
            self._order = self._permutation(self.epoch)
        idx = self._order[self.offset : self.offset + self.batch_size]
        self.offset += self.batch_size
        return [self.dataset.records[int(i)] for i in idx]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed = int(state["seed"])
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        self._order = self._permutation(self.epoch)


def load_template(spec: str) -> jinja2.Template:
    text = BUILTIN_TEMPLATE_TEXT.get(spec)
    if text is None:
        text = Path(spec).read_text()
    return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(text)


def build_messages(record: Record, template: jinja2.Template) -> list[dict[str, Any]]:
    """A single user turn; ``<image>`` and ``<video>`` markers in the problem place the
    images and videos. Without (or with mismatched) markers the images come first, then
    the videos, then the text, as most VLM datasets assume."""
    text = template.render(content=record.problem)
    if not record.images and not record.videos:
        return [{"role": "user", "content": text}]
    want = {"image": len(record.images), "video": len(record.videos)}
    parts = re.split(r"<(image|video)>", text)
    markers = parts[1::2]
    content: list[dict[str, str]] = []
    if all(markers.count(kind) == n for kind, n in want.items()):
        for i, part in enumerate(parts):
            if i % 2:
                content.append({"type": part})
            elif part:
                content.append({"type": "text", "text": part})
    else:
        content = [{"type": kind} for kind, n in want.items() for _ in range(n)]
        content.append({"type": "text", "text": re.sub(r"<(image|video)>", "", text)})
    return [{"role": "user", "content": content}]


def decode_images(images: list[bytes]) -> list[Any]:
    from PIL import Image

    return [Image.open(io.BytesIO(b)).convert("RGB") for b in images]
