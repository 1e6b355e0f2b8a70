"""What a reward sees: one response and the row it answered (docs/rewards.md).

The driver reads the rows of a step once (``reward_rows``): every column when the reward
reads rows (a function of one argument, verl's, a judge), only the answer column
otherwise, as before. A row's images are decoded on first use and shared by the
``rollout.n`` responses to it.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from grpo_api.trainer_config import DataConfig

from ..data import Record, decode_images
from ..dataset.rows import RowRef, media_bytes, raw_rows


@dataclass
class RewardRow:
    """The row a response answered: its prompt, its answer and every column as stored."""

    index: int  # the prompt's number in the dataset, from 0
    prompt: str
    ground_truth: str
    columns: Mapping[str, Any]
    image_key: str
    folder: Path  # a relative image path is read against its file's folder
    _images: list[Any] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def image_bytes(self) -> list[bytes]:
        """The row's images as their encoded files (what a judge is sent)."""
        items = self.columns.get(self.image_key) or []
        return [media_bytes(x, self.folder, f"image {i + 1}") for i, x in enumerate(items)]

    def images(self) -> list[Any]:
        """The row's images as RGB PIL images, decoded once for all its responses."""
        with self._lock:
            if self._images is None:
                self._images = decode_images(self.image_bytes())
            return self._images


@dataclass(frozen=True)
class RewardSample:
    """One response to score: what a function of one argument is given (a batch
    function gets a list of them)."""

    response: str
    response_length: int  # in tokens
    source: RewardRow

    @property
    def prompt(self) -> str:
        """The row's prompt column as written (before the prompt template)."""
        return self.source.prompt

    @property
    def ground_truth(self) -> str:
        return self.source.ground_truth

    @property
    def row(self) -> Mapping[str, Any]:
        """Every column of the row, as the file stores it."""
        return self.source.columns

    @property
    def images(self) -> list[Any]:
        """The row's images (PIL, RGB), decoded on first use."""
        return self.source.images()

    @property
    def index(self) -> int:
        return self.source.index


def reward_rows(prompts: Sequence[RowRef | Record], cfg: DataConfig, whole: bool
                ) -> list[RewardRow]:
    """The rows of a step's prompts, in their order: every column when ``whole``, else
    the answer column alone (all a reward of the response and the answer needs)."""
    refs = [p for p in prompts if isinstance(p, RowRef)]
    read = iter(raw_rows(refs, None if whole else [cfg.answer_key]))
    out: list[RewardRow] = []
    for p in prompts:
        if isinstance(p, Record):  # tests hand whole records to the driver
            columns: Mapping[str, Any] = {cfg.prompt_key: p.problem, cfg.answer_key: p.answer,
                                          cfg.image_key: list(p.images)}
            folder = Path(p.source).parent
        else:
            columns, folder = next(read), Path(p.source).parent
        out.append(RewardRow(p.index, str(columns.get(cfg.prompt_key, "")),
                             ground_truth(columns.get(cfg.answer_key)), columns, cfg.image_key,
                             folder))
    return out


def ground_truth(answer: Any) -> str:
    """The answer column as text; verl's layout keeps it in ``{"ground_truth": ...}`` (its
    ``reward_model`` column, named by data.answer_key)."""
    if isinstance(answer, Mapping) and "ground_truth" in answer:
        answer = answer["ground_truth"]
    return str(answer)


def samples_for(outputs: Sequence[Mapping[str, Any]], rows: Sequence[RewardRow]
                ) -> list[RewardSample]:
    """The ranks' outputs (``text``, ``response_tokens``, ``index``) as samples of their
    rows."""
    by_index = {r.index: r for r in rows}
    return [RewardSample(str(o["text"]), int(o["response_tokens"]), by_index[int(o["index"])])
            for o in outputs]
