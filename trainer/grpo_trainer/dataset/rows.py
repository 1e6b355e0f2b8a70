"""Rows read where they are used: a ``RowRef`` says where a row is (file, row, byte
offset); ``read_records`` turns refs into ``Record``s (prompt, answer, image bytes, video
sources) in the process that encodes them, a rank or an engine apart; the driver reads
only what the reward needs of them (``grpo_trainer.rewards.sample.reward_rows``).

Parquet rows are read by streaming the row groups that hold them in batches of
``READ_BATCH_ROWS`` and keeping the wanted rows, so a file written as one huge row group
costs time, not memory; jsonl rows are one ``seek`` each.
"""

from __future__ import annotations

import io
import json
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from grpo_api.trainer_config import DataConfig

from ..config_error import ConfigError
from ..data import Record

T = TypeVar("T")
# Rows a parquet reader decodes at once: a batch of a few hundred image rows is tens of MiB.
READ_BATCH_ROWS = 256
# Open parquet files (their footers) a process keeps: a rank reads a batch's rows from a
# handful of files again every step.
OPEN_FILES = 8


@dataclass(frozen=True, slots=True)
class RowRef:
    """Where one prompt row is: what the driver holds and sends, never the row."""

    index: int  # the prompt's number in the dataset, from 0 (seeds, answers, logs)
    source: str  # the file
    row: int  # its row in that file, from 0
    offset: int = -1  # a jsonl row's byte offset; -1 for parquet

    @property
    def where(self) -> str:
        return f"{self.source} row {self.row}"


class BadRow(ValueError):
    """A row that cannot be used; ``what`` says why (the file and row are the ref's)."""

    def __init__(self, ref: RowRef, what: str) -> None:
        super().__init__(f"{ref.where}: {what}")
        self.ref = ref
        self.what = what


def bad_row_error(err: BadRow) -> ConfigError:
    """A bad row with ``data.bad_rows: fail``: names the file, the row, what is wrong and
    the setting that would skip it."""
    return ConfigError("data.bad_rows", f"{err}; fix the row, or set data.bad_rows "
                       "(spec.data.badRows) to skip to leave such rows out")


def columns(cfg: DataConfig) -> list[str]:
    return [cfg.prompt_key, cfg.answer_key, cfg.image_key, cfg.video_key]


@dataclass(frozen=True)
class _Parquet:
    """An open parquet file: its reader, its columns, and the first row of each row group
    (and the row count last), for finding a row's group without walking the footer."""

    file: Any
    names: frozenset[str]
    starts: np.ndarray

    def groups(self, rows: np.ndarray) -> np.ndarray:
        """The row group of each of ``rows``."""
        return np.searchsorted(self.starts, rows, side="right") - 1

    def batches(self, group: int, cols: Sequence[str] | None) -> Iterator[tuple[int, Any]]:
        """Row group ``group`` of ``cols`` (those the file has; None: every column),
        READ_BATCH_ROWS rows at a time, each batch with the file row of its first row."""
        first = int(self.starts[group])
        names = None if cols is None else [c for c in cols if c in self.names]
        for batch in self.file.iter_batches(batch_size=READ_BATCH_ROWS, row_groups=[group],
                                            columns=names):
            yield first, batch
            first += batch.num_rows


class _ParquetFiles:
    """This process's open parquet files, least recently used closed first."""

    def __init__(self) -> None:
        self.files: OrderedDict[str, _Parquet] = OrderedDict()

    def get(self, path: str) -> _Parquet:
        import pyarrow.parquet as pq

        f = self.files.pop(path, None)
        if f is None:
            reader = pq.ParquetFile(path)
            meta = reader.metadata
            sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            f = _Parquet(reader, frozenset(reader.schema_arrow.names),
                         np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]))
        self.files[path] = f
        while len(self.files) > OPEN_FILES:
            self.files.popitem(last=False)
        return f


_PARQUET = _ParquetFiles()


def parquet_rows(path: str, rows: Sequence[int], cols: Sequence[str] | None
                 ) -> dict[int, dict[str, Any]]:
    """``rows`` of a parquet file, only ``cols`` (those it has), by row number: each row
    group that holds some streamed until its last wanted row."""
    f = _PARQUET.get(path)
    wanted = np.unique(np.asarray(rows, dtype=np.int64))
    groups = f.groups(wanted)
    out: dict[int, dict[str, Any]] = {}
    for group in np.unique(groups):
        mine = wanted[groups == group]
        for first, batch in f.batches(int(group), cols):
            take = mine[(mine >= first) & (mine < first + batch.num_rows)]
            if take.size:
                part = batch.take((take - first).tolist()).to_pylist()
                out.update(zip(take.tolist(), part, strict=True))
            if first + batch.num_rows > mine[-1]:
                break
    return out


def jsonl_row(path: str, offset: int) -> dict[str, Any]:
    with open(path, "rb") as f:
        f.seek(offset)
        value = json.loads(f.readline())
    if not isinstance(value, dict):
        raise ValueError(f"a jsonl row must be an object, not {type(value).__name__}")
    return value


def raw_rows(refs: Sequence[RowRef], cols: Sequence[str] | None) -> list[dict[str, Any]]:
    """The rows of ``refs`` (only ``cols`` of a parquet file's; None: every column), in
    the refs' order."""
    by_file: dict[str, list[RowRef]] = {}
    for ref in refs:
        by_file.setdefault(ref.source, []).append(ref)
    got: dict[tuple[str, int], dict[str, Any]] = {}
    for path, mine in by_file.items():
        if mine[0].offset < 0:
            for row, value in parquet_rows(path, [r.row for r in mine], cols).items():
                got[(path, row)] = value
        else:
            for r in mine:
                got[(path, r.row)] = jsonl_row(path, r.offset)
    return [got[(r.source, r.row)] for r in refs]


def media_bytes(item: Any, base: Path, what: str) -> bytes:
    if isinstance(item, dict):
        if item.get("bytes"):
            return bytes(item["bytes"])
        item = item.get("path")
    if isinstance(item, bytes | bytearray):
        return bytes(item)
    if isinstance(item, str):
        p = Path(item) if Path(item).is_absolute() else base / item
        try:
            return p.read_bytes()
        except OSError as err:
            raise ValueError(f"{what} {p} cannot be read ({err.strerror or err})") from err
    raise ValueError(f"{what} is a {type(item).__name__}, not bytes, a path or "
                     "{bytes, path}")


def _video(item: Any, base: Path, what: str) -> str | list[bytes]:
    """A video file's absolute path (checked to exist), or its frames' bytes."""
    if isinstance(item, str):
        p = Path(item) if Path(item).is_absolute() else base / item
        if not p.is_file():
            raise ValueError(f"{what} {p} does not exist")
        return str(p)
    if isinstance(item, list | tuple):
        if not item:
            raise ValueError(f"{what} has no frames")
        return [media_bytes(f, base, f"{what} frame {i + 1}") for i, f in enumerate(item)]
    raise ValueError(f"{what} is a {type(item).__name__}, not a path or a list of frames")


def to_record(ref: RowRef, row: dict[str, Any], cfg: DataConfig) -> Record:
    """The row as a Record; a row that cannot be one is a ``BadRow`` saying why."""
    for key, name in ((cfg.prompt_key, "prompt"), (cfg.answer_key, "answer")):
        if row.get(key) is None:
            raise BadRow(ref, f"no {name} (column {key!r} is missing or null)")
    problem = str(row[cfg.prompt_key])
    if not problem.strip():
        raise BadRow(ref, f"the prompt (column {cfg.prompt_key!r}) is empty")
    base = Path(ref.source).parent
    try:
        images = [media_bytes(x, base, f"image {i + 1}")
                  for i, x in enumerate(row.get(cfg.image_key) or [])]
        videos = [_video(x, base, f"video {i + 1}")
                  for i, x in enumerate(row.get(cfg.video_key) or [])]
    except ValueError as err:
        raise BadRow(ref, str(err)) from err
    return Record(index=ref.index, problem=problem, answer=str(row[cfg.answer_key]),
                  images=images, videos=videos, source=ref.source, row=ref.row)


def check_headers(record: Record, ref: RowRef) -> None:
    """Every image's header read (what a load can see without decoding): bytes that are
    no image PIL knows are named here, not as a rank's crash."""
    from PIL import Image

    for i, b in enumerate(record.images):
        try:
            with Image.open(io.BytesIO(b)):
                pass
        except Exception as err:  # PIL raises UnidentifiedImageError, OSError, ...
            raise BadRow(ref, f"image {i + 1} is not an image that can be read "
                         f"({type(err).__name__}, {len(b)} bytes)") from err


def check_images(record: Record, ref: RowRef) -> None:
    """Every image of the record decoded in full (a truncated or corrupt file is found
    here, not in a rank's ``generate``): ``data.bad_rows: skip`` checks each row so."""
    from PIL import Image

    for i, b in enumerate(record.images):
        try:
            with Image.open(io.BytesIO(b)) as im:
                im.load()
        except Exception as err:  # PIL raises OSError, SyntaxError, ValueError...
            raise BadRow(ref, f"image {i + 1} cannot be decoded ({err})") from err


def examine(ref: RowRef, row: dict[str, Any], cfg: DataConfig,
            counter: Callable[[Record], int] | None, full_check: bool) -> tuple[Record, int]:
    """The row as a Record, checked as a load checks it (its images' headers, or with
    ``full_check`` their whole decode), and its prompt's tokens (-1 without a counter).
    Every reason the row cannot be used is a ``BadRow``; a ConfigError (pixel bounds no
    image fits) is the config's, and leaves as it is."""
    record = to_record(ref, row, cfg)
    check_headers(record, ref)
    if full_check:
        check_images(record, ref)
    try:
        return record, counter(record) if counter is not None else -1
    except ConfigError:
        raise
    except (ValueError, OSError, SyntaxError) as err:  # e.g. an aspect ratio over 200
        raise BadRow(ref, f"it cannot be encoded ({err})") from err


def read_records(items: Sequence[RowRef | Record], cfg: DataConfig) -> list[Record]:
    """Records for ``items`` (a Record passes as it is), read here; a bad row is a
    ConfigError naming it (``data.bad_rows: fail``; with skip the driver never draws one
    that a load could see)."""
    refs = [x for x in items if isinstance(x, RowRef)]
    rows = iter(raw_rows(refs, columns(cfg)))
    out: list[Record] = []
    for x in items:
        if isinstance(x, Record):
            out.append(x)
            continue
        try:
            out.append(to_record(x, next(rows), cfg))
        except BadRow as err:
            raise bad_row_error(err) from err
    return out


def encode_rows(encode: Callable[[Record], T], records: Sequence[Record]) -> list[T]:
    """Each record encoded (its media decoded); one whose media cannot be decoded (a
    truncated image that a load's header check passed) is a ConfigError naming its file
    and row, not a crash that a restart would meet again."""
    out: list[T] = []
    for r in records:
        try:
            out.append(encode(r))
        except ConfigError:
            raise
        except (OSError, ValueError, SyntaxError) as err:  # PIL's decode errors
            where = RowRef(r.index, r.source, r.row) if r.source else None
            if where is None:
                raise
            raise bad_row_error(BadRow(where, f"it cannot be decoded ({err})")) from err
    return out


def file_rows(path: str, cols: Sequence[str], start: int, stop: int, offset: int
              ) -> Iterator[tuple[int, int, dict[str, Any]]]:
    """Rows ``start`` to ``stop`` of a file as (row, byte offset or -1, row), streamed:
    a parquet file by batches, a jsonl file from ``offset`` (row ``start``'s)."""
    if offset < 0:
        pf = _PARQUET.get(path)
        first_group, last_group = pf.groups(np.asarray([start, stop - 1]))
        for group in range(int(first_group), int(last_group) + 1):
            for first, batch in pf.batches(group, cols):
                for i, row in enumerate(batch.to_pylist()):
                    if start <= first + i < stop:
                        yield first + i, -1, row
                if first + batch.num_rows >= stop:
                    return
        return
    with open(path, "rb") as f:
        f.seek(offset)
        row = start
        while row < stop:
            at = f.tell()
            line = f.readline()
            if not line:
                return
            if line.strip():
                value = json.loads(line)
                yield row, at, value if isinstance(value, dict) else {}
                row += 1
