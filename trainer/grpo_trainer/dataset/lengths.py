"""The length pass: each row read once, checked (``rows.to_record``), its images and videos
counted and its prompt's tokens counted as the ranks will encode it, in chunks of
``CHUNK_ROWS`` rows, across a pool of processes when the data is large.

Every chunk is a pure function of (file, first row, last row) and the config, so the pass
gives the same answer in one process or many, and its result can be kept
(index.py keeps it). What the driver keeps of a row is a few numbers (``RowIndex``).
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from grpo_api.contract import LENGTH_POOL_MIN_ROWS, LENGTH_WORKERS_MAX
from grpo_api.trainer_config import Config, DataConfig

from ..config_error import ConfigError
from ..data import Record
from .rows import BadRow, RowRef, columns, examine, file_rows

log = logging.getLogger(__name__)

# Rows per task of the pass: big enough that a process's start is paid back, small
# enough that the last tasks end together.
CHUNK_ROWS = 2048
# Below this many rows the pass runs in the driver (the planner counts no pool then).
POOL_MIN_ROWS = LENGTH_POOL_MIN_ROWS
# A log line (and a progress report) at most this often.
PROGRESS_EVERY_S = 10.0
# Tokens of a row the pass did not count (no counter, or promptLengths lazy).
UNCOUNTED = -1


@dataclass(frozen=True)
class Chunk:
    path: str
    start: int  # first row
    stop: int  # one past the last
    offset: int  # row ``start``'s byte offset (jsonl), -1 for parquet
    first_index: int  # the dataset index of row ``start``


@dataclass
class ChunkResult:
    chunk: Chunk
    tokens: np.ndarray  # int32, UNCOUNTED where not counted
    images: np.ndarray  # uint8
    videos: np.ndarray  # uint8
    bad: list[tuple[int, str]] = field(default_factory=list)  # (row, what)


Counter = Callable[[Record], int]


def count_chunk(chunk: Chunk, cfg: DataConfig, counter: Counter | None, full_check: bool
                ) -> ChunkResult:
    """One chunk's rows: counts, and the rows that cannot be used with why. A
    ConfigError (pixel bounds no image fits) is the config's, not the row's: it names the
    row and leaves."""
    n = chunk.stop - chunk.start
    tokens = np.full(n, UNCOUNTED, dtype=np.int32)
    images = np.zeros(n, dtype=np.uint8)
    videos = np.zeros(n, dtype=np.uint8)
    bad: list[tuple[int, str]] = []
    for row, offset, value in file_rows(chunk.path, columns(cfg), chunk.start, chunk.stop,
                                        chunk.offset):
        i = row - chunk.start
        ref = RowRef(chunk.first_index + i, chunk.path, row, offset)
        try:
            record, tokens[i] = examine(ref, value, cfg, counter, full_check)
        except BadRow as err:
            bad.append((row, err.what))
            continue
        except ConfigError as err:
            raise ConfigError(err.field, f"{ref.where}: {err.message}") from err
        images[i] = min(len(record.images), 255)
        videos[i] = min(len(record.videos), 255)
    return ChunkResult(chunk, tokens, images, videos, bad)


@dataclass(frozen=True)
class _PoolProcess:
    """What a pool process counts with: it builds the counter (the tokenizer and
    processor) once."""

    data: DataConfig
    counter: Counter
    full_check: bool


_POOL: list[_PoolProcess] = []


def _pool_init(config_json: str, full_check: bool) -> None:
    from ..algorithm.samples import prompt_token_counter

    cfg = Config.model_validate_json(config_json)
    _POOL.append(_PoolProcess(cfg.data, prompt_token_counter(cfg), full_check))


def _pool_count(chunk: Chunk) -> ChunkResult:
    (p,) = _POOL
    return count_chunk(chunk, p.data, p.counter, p.full_check)


def cgroup_cpus() -> int | None:
    """The CPU limit of this process's cgroup, rounded up (v2 cpu.max, v1 cfs quota), or
    None when there is none: a pod's CPU limit, which its cpuset does not show."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    try:
        quota = Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text().strip()
        period = Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text().strip()
        return None if int(quota) <= 0 else max(1, math.ceil(int(quota) / int(period)))
    except (OSError, ValueError):
        return None


def usable_cpus() -> int:
    """The CPUs this process may use: its cpuset, within its cgroup's CPU limit, at most
    LENGTH_WORKERS_MAX (each pass process holds a tokenizer and processor)."""
    limit = cgroup_cpus()
    cpus = len(os.sched_getaffinity(0))
    return max(1, min(cpus, limit or cpus, LENGTH_WORKERS_MAX))


class Progress:
    """Rows done, their rate and the time left, logged every PROGRESS_EVERY_S."""

    def __init__(self, total: int, what: str, report: Callable[[str], None] | None) -> None:
        self.total, self.what, self.report = total, what, report
        self.done = 0
        self.t0 = self.last = time.monotonic()

    def add(self, rows: int) -> None:
        self.done += rows
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY_S and self.done < self.total:
            return
        self.last = now
        rate = self.done / max(now - self.t0, 1e-9)
        left = (self.total - self.done) / rate if rate > 0 else float("inf")
        line = (f"{self.what}: {self.done}/{self.total} rows ({rate:.0f} rows/s, "
                f"{left:.0f} s left)")
        log.info("%s", line)
        if self.report is not None:
            self.report(line)


def run_pass(chunks: list[Chunk], cfg: DataConfig, *, counter: Counter | None,
             config: Config | None, workers: int, full_check: bool, what: str,
             report: Callable[[str], None] | None = None) -> list[ChunkResult]:
    """Every chunk counted, in order: in this process, or with ``config`` and at least
    POOL_MIN_ROWS rows, across ``workers`` processes (spawned: the driver may hold threads
    and Ray's client, which a fork would copy mid-state). The config goes to them with
    only the fields that were set: which were decides the pixel bounds (images.pixel_bounds:
    the checkpoint processor's own unless the config sets them)."""
    total = sum(c.stop - c.start for c in chunks)
    progress = Progress(total, what, report)
    if config is None or workers <= 1 or total < POOL_MIN_ROWS:
        out = []
        for c in chunks:
            out.append(count_chunk(c, cfg, counter, full_check))
            progress.add(c.stop - c.start)
        return out
    log.info("%s: %d rows in %d chunks across %d processes", what, total, len(chunks),
             workers)
    ctx = multiprocessing.get_context("spawn")
    args = (config.model_dump_json(exclude_unset=True), full_check)
    with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_pool_init,
                             initargs=args) as pool:
        results = []
        for r in pool.map(_pool_count, chunks):
            results.append(r)
            progress.add(r.chunk.stop - r.chunk.start)
        return results
