"""The driver's index of the prompt rows: per row where it is (file, row, byte offset),
its dataset index, its prompt's tokens and its image and video counts, as numpy arrays
(about ``INDEX_BYTES_PER_ROW`` bytes a row), never the row itself.

Built by a scan (row counts from parquet footers, line offsets of jsonl files) and, with
``data.prompt_lengths: eager``, the length pass (lengths.py), whose result is kept under
``<checkpoint.dir>/data-index/`` keyed by the files and the processor settings
(``index_key``), so that a restart or a resumed job starts at once. Rows are then left
out or refused by the data settings (prompts.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from grpo_api.trainer_config import Config, DataConfig

from ..config_error import ConfigError
from ..data import data_files
from .lengths import CHUNK_ROWS, UNCOUNTED, Chunk, ChunkResult, Counter, run_pass, usable_cpus
from .rows import RowRef

log = logging.getLogger(__name__)

# Bumped whenever what the pass computes changes: older cached indexes are then not used.
INDEX_FORMAT = 1
INDEX_DIR = "data-index"
# Each file's identity in the key: its size, modification time and a hash of this many
# bytes at each end (a parquet file's footer, with every column chunk's offsets and
# statistics, is at its end). Hashing whole files of images would cost a restart minutes.
HASHED_END_BYTES = 1 << 20
# A parquet row group above this many rows makes a rank's read of one row slow (a warning).
LARGE_ROW_GROUP = 10_000
# The model's files that decide how a prompt is tokenized and how its images are sized.
PROCESSOR_FILES = ("tokenizer.json", "tokenizer_config.json", "preprocessor_config.json",
                   "video_preprocessor_config.json", "processor_config.json",
                   "chat_template.json", "chat_template.jinja", "config.json")


@dataclass
class RowIndex:
    """Per row, in dataset order. ``ids`` is each row's dataset index (its position among
    every row of the files), kept when rows are left out: seeds and names use it."""

    files: list[str]
    file: np.ndarray  # int32, into files
    row: np.ndarray  # int32
    offset: np.ndarray  # int64 (jsonl), -1 (parquet)
    ids: np.ndarray  # int32
    tokens: np.ndarray  # int32, lengths.UNCOUNTED where not counted
    images: np.ndarray  # uint8
    videos: np.ndarray  # uint8

    def __len__(self) -> int:
        return int(self.ids.size)

    def ref(self, i: int) -> RowRef:
        return RowRef(int(self.ids[i]), self.files[int(self.file[i])], int(self.row[i]),
                      int(self.offset[i]))

    def where(self, i: int) -> str:
        return self.ref(i).where

    def take(self, keep: np.ndarray) -> RowIndex:
        arrays = {f.name: getattr(self, f.name)[keep] for f in fields(self) if f.name != "files"}
        return RowIndex(self.files, **arrays)

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, f.name).nbytes for f in fields(self) if f.name != "files")


def _jsonl_offsets(path: Path) -> np.ndarray:
    offsets: list[int] = []
    at = 0
    with open(path, "rb") as f:
        for line in f:
            if line.strip():
                offsets.append(at)
            at += len(line)
    return np.asarray(offsets, dtype=np.int64)


def _check_columns(path: Path, names: list[str], cfg: DataConfig) -> None:
    """A parquet file without the prompt or answer column: the file's fault, not a row's."""
    for key, setting in ((cfg.prompt_key, "data.prompt_key"), (cfg.answer_key,
                                                                "data.answer_key")):
        if key not in names:
            raise ConfigError(setting, f"{path} has no column {key!r} (its columns: "
                              f"{', '.join(names)}); name the right one in {setting}")


def data_paths(entries: list[str], field: str) -> list[Path]:
    """The files of ``entries`` (data.data_files), each there and of a kind we read."""
    paths = [p for e in entries for p in data_files(e, field)]
    for path in paths:
        if not path.is_file():
            raise ConfigError(field, f"{path} does not exist")
        if path.suffix not in (".parquet", ".jsonl", ".json"):
            raise ConfigError(field, f"{path}: unsupported file type {path.suffix!r} "
                              "(parquet, jsonl)")
    return paths


def scan(paths: list[Path], field: str, cfg: DataConfig) -> RowIndex:
    """Where every row of ``paths`` (data_paths) is, counts unknown."""
    files: list[str] = []
    file, row, offset = [], [], []
    for path in paths:
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            pf = pq.ParquetFile(path)
            _check_columns(path, pf.schema_arrow.names, cfg)
            n = pf.metadata.num_rows
            largest = max((pf.metadata.row_group(g).num_rows
                           for g in range(pf.metadata.num_row_groups)), default=0)
            if largest > LARGE_ROW_GROUP:
                log.warning("%s has row groups of up to %d rows: a rank reading one row "
                            "streams the whole group; rewrite it with row groups of a few "
                            "hundred rows (pyarrow's row_group_size; Hugging Face datasets "
                            "writes image data so)", path, largest)
            offs = np.full(n, -1, dtype=np.int64)
        else:
            offs = _jsonl_offsets(path)
        file.append(np.full(offs.size, len(files), dtype=np.int32))
        row.append(np.arange(offs.size, dtype=np.int32))
        offset.append(offs)
        files.append(str(path))
    n = sum(a.size for a in file)
    if n == 0:
        raise ConfigError(field, "no rows found")
    return RowIndex(files, np.concatenate(file), np.concatenate(row), np.concatenate(offset),
                    np.arange(n, dtype=np.int32), np.full(n, UNCOUNTED, dtype=np.int32),
                    np.zeros(n, dtype=np.uint8), np.zeros(n, dtype=np.uint8))


def chunks_of(index: RowIndex) -> list[Chunk]:
    out: list[Chunk] = []
    starts = np.flatnonzero(np.r_[True, index.file[1:] != index.file[:-1]])
    for s, e in zip(starts, [*starts[1:], len(index)], strict=True):
        for a in range(int(s), int(e), CHUNK_ROWS):
            b = min(a + CHUNK_ROWS, int(e))
            out.append(Chunk(index.files[int(index.file[a])], int(index.row[a]),
                             int(index.row[b - 1]) + 1, int(index.offset[a]),
                             int(index.ids[a])))
    return out


@dataclass
class Counted:
    """The length pass's result: the index with counts, and the rows it cannot use."""

    index: RowIndex
    bad: list[tuple[int, str]]  # (position in index, what is wrong)


def apply_results(index: RowIndex, results: list[ChunkResult]) -> Counted:
    bad: list[tuple[int, str]] = []
    at = 0
    for r in results:
        n = r.tokens.size
        index.tokens[at:at + n] = r.tokens
        index.images[at:at + n] = r.images
        index.videos[at:at + n] = r.videos
        bad += [(at + row - r.chunk.start, what) for row, what in r.bad]
        at += n
    return Counted(index, bad)


def _file_identity(path: str) -> dict[str, object]:
    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(HASHED_END_BYTES))
        if st.st_size > HASHED_END_BYTES:
            f.seek(max(HASHED_END_BYTES, st.st_size - HASHED_END_BYTES))
            h.update(f.read())
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "sha256_ends": h.hexdigest()}


def _file_hash(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def index_key(files: list[str], config: Config) -> str:
    """What the pass's result depends on: the files, the data settings that change a
    row's count or whether it can be used, and the model's tokenizer and processor."""
    d = config.data
    settings = {k: getattr(d, k) for k in (
        "prompt_key", "answer_key", "image_key", "video_key", "format_prompt",
        "image_max_pixels", "image_min_pixels", "video_fps", "max_frames",
        "video_max_pixels", "video_min_pixels", "bad_rows")}
    template = Path(d.format_prompt)
    model_dir = Path(config.model.tokenizer_path or config.model.path)
    key = {
        "format": INDEX_FORMAT,
        "files": [_file_identity(f) for f in files],
        "data": settings,
        # Which were set decides the pixel bounds (images.pixel_bounds).
        "set": sorted(d.model_fields_set),
        "template": _file_hash(template) if template.suffix else None,
        "model": str(model_dir),
        "processor": {name: _file_hash(model_dir / name) for name in PROCESSOR_FILES},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:32]


def save_counted(path: Path, counted: Counted) -> None:
    """Written whole or not at all: a temporary file renamed over the name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    ix = counted.index
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, files=np.asarray(ix.files), file_of=ix.file, row=ix.row, offset=ix.offset,
             ids=ix.ids, tokens=ix.tokens, images=ix.images, videos=ix.videos,
             bad_at=np.asarray([b for b, _ in counted.bad], dtype=np.int64),
             bad_what=np.asarray([w for _, w in counted.bad], dtype=str))
    os.replace(tmp, path)


def load_counted(path: Path) -> Counted | None:
    """The kept result, or None when there is none or it cannot be read (it is then
    counted again and written anew)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            ix = RowIndex([str(f) for f in z["files"]], z["file_of"], z["row"], z["offset"],
                          z["ids"], z["tokens"], z["images"], z["videos"])
            bad = [(int(a), str(w)) for a, w in zip(z["bad_at"], z["bad_what"], strict=True)]
    except (OSError, ValueError, KeyError) as err:
        log.warning("the kept prompt index %s cannot be read (%s): counting again", path, err)
        return None
    return Counted(ix, bad)


def count_rows(entries: list[str], cfg: DataConfig, field: str, *,
               counter: Counter | None = None, config: Config | None = None,
               cache_dir: Path | None = None,
               report: Callable[[str], None] | None = None) -> Counted:
    """The index of ``entries`` with every row counted and checked (the kept result when
    ``cache_dir`` has it). ``counter``: a prompt's tokens, in this process; ``config``:
    the whole config, for the pool's processes and the key."""
    paths = data_paths(entries, field)
    path = None
    if cache_dir is not None and config is not None:
        # Looked up before the scan: a second start reads no jsonl file to its end.
        path = cache_dir / INDEX_DIR / f"{index_key([str(p) for p in paths], config)}.npz"
        kept = load_counted(path)
        if kept is not None and kept.index.files == [str(p) for p in paths]:
            log.info("%s: %d rows' lengths from %s", field, len(kept.index), path)
            return kept
    index = scan(paths, field, cfg)
    workers = min(cfg.length_workers or usable_cpus(), usable_cpus())
    results = run_pass(chunks_of(index), cfg, counter=counter, config=config,
                       workers=workers, full_check=cfg.bad_rows == "skip",
                       what=f"{field}: prompt lengths", report=report)
    counted = apply_results(index, results)
    if path is not None:
        try:
            save_counted(path, counted)
        except OSError as err:  # a read-only volume: the next start counts again
            log.warning("the prompt index could not be kept at %s (%s)", path, err)
    return counted
