"""A prompt row and how it becomes a chat turn: EasyR1-layout columns, Jinja2 prompt
templates, where a split's files are.

Rows have ``problem`` (text, may contain ``<image>`` and ``<video>`` markers), ``answer``
and optionally ``images`` (a list of encoded bytes, paths, or ``{"bytes", "path"}`` dicts
as Hugging Face datasets store them) and ``videos`` (each a video file's path or a list of
frames). How rows are indexed, read and drawn: grpo_trainer.dataset.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2

from .config_error import ConfigError

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
    # (decoded and sampled where the prompt is encoded: grpo_trainer.media.videos).
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
