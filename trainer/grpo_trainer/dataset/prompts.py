"""The prompt set the driver draws from: the index (index.py) with the rows the data
settings leave out taken out, or refused.

A row is left out (``data.overlong_prompts: drop``, logged) or refused (``fail``: a
ConfigError) when its prompt is longer than ``data.max_prompt_length`` or it has more
images or videos than ``data.max_images_per_prompt`` / ``max_videos_per_prompt``: vLLM
would fail the whole TP group's ``generate`` on it, and the update would train on a
truncated prompt. A row that cannot be read at all is refused or skipped by
``data.bad_rows``. Every message names the file, the row, what is wrong and the setting.
With ``data.prompt_lengths: lazy`` nothing is counted here: the loader checks each row
when it is drawn (``DrawCheck``), with the same decisions.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from grpo_api.job.trainer import config_sources
from grpo_api.trainer_config import (
    MAX_IMAGES_PER_PROMPT,
    MAX_VIDEOS_PER_PROMPT,
    Config,
    DataConfig,
)

from ..config_error import ConfigError
from ..data import Record
from .index import RowIndex, count_rows, data_paths, scan
from .lengths import UNCOUNTED, Counter
from .rows import BadRow, RowRef, bad_row_error, columns, examine, raw_rows, read_records

log = logging.getLogger(__name__)
# Rows named one by one in a drop message; the rest are counted.
MAX_NAMED = 20


def setting(key: str) -> str:
    """``data.<key>`` with the GRPOJob field that sets it, for messages."""
    path = f"data.{key}"
    return f"{path} ({config_sources()[path]})"


def overlong(where: str, tokens: int, limit: int) -> str:
    """Where a prompt is and how much too long."""
    return (f"{where}: the prompt has {tokens} tokens, more than the {limit} of "
            f"{setting('max_prompt_length')}")


def too_many(where: str, kind: str, n: int, cap: int, top: int) -> str:
    key = f"max_{kind}s_per_prompt"
    return (f"{where}: the prompt has {n} {kind}s, more than the {cap} of {setting(key)} "
            f"(at most {top})")


def row_problem(cfg: DataConfig, where: str, tokens: int, images: int, videos: int
                ) -> tuple[str, str, str] | None:
    """What keeps a counted row out: (the problem, the setting that limits it, the fix),
    or None. The one rule for the load's index and a lazy draw."""
    if images > cfg.max_images_per_prompt:
        return (too_many(where, "image", images, cfg.max_images_per_prompt,
                         MAX_IMAGES_PER_PROMPT), "data.max_images_per_prompt",
                f"raise it (at most {MAX_IMAGES_PER_PROMPT}) or split the row")
    if videos > cfg.max_videos_per_prompt:
        return (too_many(where, "video", videos, cfg.max_videos_per_prompt,
                         MAX_VIDEOS_PER_PROMPT), "data.max_videos_per_prompt",
                f"raise it (at most {MAX_VIDEOS_PER_PROMPT}) or split the row")
    if tokens != UNCOUNTED and tokens > cfg.max_prompt_length:
        return (overlong(where, tokens, cfg.max_prompt_length), "data.max_prompt_length",
                "raise it")
    return None


def refuse(problem: tuple[str, str, str]) -> ConfigError:
    where, limit_field, fix = problem
    return ConfigError(limit_field, f"{where}; {fix}, or set {setting('overlong_prompts')} "
                       "to drop to leave such prompts out")


# What a whole data set left out says, by the setting that left its first row out.
EVERY_PROMPT = {"data.max_prompt_length": "is too long",
                "data.max_images_per_prompt": "has too many images",
                "data.max_videos_per_prompt": "has too many videos",
                "data.bad_rows": "cannot be read"}


def _log_left_out(verb: str, key: str, value: str, named: list[str], of: int,
                  field: str) -> None:
    """One line for the rows ``data.<key>: value`` left out: the first MAX_NAMED by name."""
    if named:
        total = len(named)
        log.warning("%s %d of %d prompts of %s (%s: %s): %s", verb, total, of, field,
                    setting(key), value,
                    "; ".join(named[:MAX_NAMED])
                    + (f"; and {total - MAX_NAMED} more" if total > MAX_NAMED else ""))


class PromptDataset:
    """The prompt rows of ``files`` as an index: ``ref(i)`` says where row ``i`` is,
    ``read`` reads rows. ``prompt_tokens`` counts a prompt's tokens in this process;
    ``config`` (the whole config) lets the count run across processes and, with
    ``cache_dir``, be kept."""

    def __init__(
        self,
        files: list[str],
        cfg: DataConfig,
        field: str = "data.train_files",
        prompt_tokens: Counter | None = None,
        *,
        config: Config | None = None,
        cache_dir: Path | None = None,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = cfg
        self.field = field
        self.bad_rows = 0  # rows skipped (data.bad_rows: skip) at load
        self.lazy = cfg.prompt_lengths == "lazy" and prompt_tokens is not None
        if self.lazy:
            self.index = scan(data_paths(files, field), field, cfg)
            return
        counted = count_rows(files, cfg, field, counter=prompt_tokens, config=config,
                             cache_dir=cache_dir, report=report)
        index = counted.index
        keep = np.ones(len(index), dtype=bool)
        if counted.bad:
            if cfg.bad_rows == "fail":
                at, what = counted.bad[0]
                raise bad_row_error(BadRow(index.ref(at), what))
            keep[[at for at, _ in counted.bad]] = False
            self.bad_rows = len(counted.bad)
            _log_left_out("skipped", "bad_rows", "skip",
                          [f"{index.where(at)}: {what}" for at, what in counted.bad],
                          len(index), field)
        over: list[str] = []
        first_limit = "data.bad_rows"
        for i in np.flatnonzero(keep & self._over_limits(index)):
            problem = row_problem(cfg, index.where(int(i)), int(index.tokens[i]),
                                  int(index.images[i]), int(index.videos[i]))
            assert problem is not None
            if cfg.overlong_prompts == "fail":
                raise refuse(problem)
            keep[i] = False
            if not over:
                first_limit = problem[1]
            over.append(problem[0])
        _log_left_out("dropped", "overlong_prompts", "drop", over, len(index), field)
        if not keep.any():
            first = over[0] if over else index.where(counted.bad[0][0]) + ": " + counted.bad[0][1]
            raise ConfigError(field, f"every prompt {EVERY_PROMPT[first_limit]}: {first}")
        self.index = index.take(keep) if not keep.all() else index

    def _over_limits(self, index: RowIndex) -> np.ndarray:
        c = self.cfg
        return ((index.images > c.max_images_per_prompt)
                | (index.videos > c.max_videos_per_prompt)
                | ((index.tokens != UNCOUNTED) & (index.tokens > c.max_prompt_length)))

    def __len__(self) -> int:
        return len(self.index)

    def ref(self, i: int) -> RowRef:
        return self.index.ref(i)

    def refs(self) -> list[RowRef]:
        return [self.index.ref(i) for i in range(len(self.index))]

    def read(self, refs: Sequence[RowRef]) -> list[Record]:
        return read_records(refs, self.cfg)

    @property
    def records(self) -> list[Record]:
        """Every row read: for tests and small sets, never the driver's train split."""
        return self.read(self.refs())

    def most(self, kind: str) -> int | None:
        """The most images (``kind`` "images") or videos a row has, None when not
        counted (lazy lengths)."""
        if self.lazy:
            return None
        arr = self.index.images if kind == "images" else self.index.videos
        return int(arr.max()) if arr.size else 0


class DrawCheck:
    """``data.prompt_lengths: lazy``: each drawn row read in the driver and checked as the
    load would have (bad rows, media counts, length), deterministic, so every attempt
    leaves out the same rows. Returns which of ``refs`` to keep; raises for ``fail``."""

    def __init__(self, cfg: DataConfig, prompt_tokens: Counter) -> None:
        self.cfg = cfg
        self.prompt_tokens = prompt_tokens
        self.skipped = 0

    def __call__(self, refs: Sequence[RowRef]) -> list[bool]:
        cfg = self.cfg
        keep: list[bool] = []
        for ref, value in zip(refs, raw_rows(refs, columns(cfg)), strict=True):
            try:
                record, tokens = examine(ref, value, cfg, self.prompt_tokens,
                                         cfg.bad_rows == "skip")
            except BadRow as err:
                if cfg.bad_rows == "fail":
                    raise bad_row_error(err) from err
                log.warning("skipped (%s: skip) %s", setting("bad_rows"), err)
                self.skipped += 1
                keep.append(False)
                continue
            problem = row_problem(cfg, ref.where, tokens, len(record.images),
                                  len(record.videos))
            if problem is not None and cfg.overlong_prompts == "fail":
                raise refuse(problem)
            if problem is not None:
                log.warning("dropped (%s: drop) %s", setting("overlong_prompts"), problem[0])
            keep.append(problem is None)
        return keep


def sized_for_media(cfg: Config, *datasets: PromptDataset) -> Config:
    """``cfg`` with ``data.max_images_per_prompt`` (and ``max_videos_per_prompt``) lowered
    to the most a loaded row has (images: at least 1: vLLM then still builds and profiles
    the vision tower, which every weight sync writes). What the ranks' and engines' vLLM is
    sized by (rollout/build.py ``vllm_config``); the rows were limited to the settings at
    load. Lazy lengths count nothing at load: the settings stay."""
    d = cfg.data
    found = [(ds.most("images"), ds.most("videos")) for ds in datasets]
    if any(i is None for i, _ in found):
        return cfg
    images = max(1, min(d.max_images_per_prompt, max((i or 0 for i, _ in found), default=0)))
    videos = min(d.max_videos_per_prompt, max((v or 0 for _, v in found), default=0))
    return cfg.model_copy(update={"data": d.model_copy(
        update={"max_images_per_prompt": images, "max_videos_per_prompt": videos})})
