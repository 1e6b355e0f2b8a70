"""DCP's file reader, reading each saved tensor's bytes straight into its destination.

Stock ``FileSystemReader`` reads every saved tensor into a fresh buffer, unpickles
it with ``torch.load`` into fresh storage and then copies it into the model's or
optimizer's tensor: two extra copies, and new memory that the kernel must fault in
page by page (the dominant cost on small VMs, docs/benchmarks.md). Here each item's
small header (torch.save's zip records) is parsed with ``torch.load(map_location=
"meta")``, which reads no tensor data, and then the data bytes go with ``preadv``
directly into the destination. Anything unusual (GPU destinations, a narrow that
is not a run of whole rows, another dtype or layout, transforms) takes the stock
path, item by item, so results are identical either way.

Integrity is checked by ``rank.py`` in parallel with DCP's planning; its gate
(``before_read``) holds the reads until every rank's digests match.
"""

from __future__ import annotations

import io
import math
import os
from collections import defaultdict
from collections.abc import Callable
from typing import IO, Any, cast

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem


class _Window(io.RawIOBase):
    """A read-only, seekable view of ``length`` bytes at ``offset`` of an open file.

    ``torch.load`` reads an item's zip records in many small reads at its start
    (the pickle) and end (the directory); the first and last ``EDGE`` bytes are
    fetched once so those cost no system call each.
    """

    EDGE = 4096

    def __init__(self, fd: int, offset: int, length: int) -> None:
        super().__init__()
        self._fd, self._start, self._len, self._pos = fd, offset, length, 0
        self.head = os.pread(fd, min(length, self.EDGE), offset)
        self._tail_at = max(len(self.head), length - self.EDGE)
        self._tail = b""  # fetched on first use: a known layout never needs it

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._len}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def readinto(self, buf: Any) -> int:
        view = memoryview(buf).cast("B")
        n = max(0, min(len(view), self._len - self._pos))
        pos, end = self._pos, self._pos + n
        if end <= len(self.head):
            view[:n] = self.head[pos:end]
            got = n
        elif pos >= self._tail_at:
            if not self._tail:
                self._tail = os.pread(
                    self._fd, self._len - self._tail_at, self._start + self._tail_at
                )
            view[:n] = self._tail[pos - self._tail_at : end - self._tail_at]
            got = n
        else:
            got = os.preadv(self._fd, [view[:n]], self._start + pos) if n else 0
        self._pos += got
        return got


def _pread_exact(fd: int, dest: memoryview, offset: int) -> None:
    done = 0
    while done < len(dest):
        n = os.preadv(fd, [dest[done:]], offset + done)
        if n <= 0:
            raise OSError(f"checkpoint file ends {len(dest) - done} bytes early")
        done += n


def _byte_view(t: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, writable (0-dim tensors included)."""
    return memoryview(cast(Any, t.reshape(-1).view(torch.uint8).numpy())).cast("B")


class DirectReader(FileSystemReader):
    """``FileSystemReader`` whose whole-row tensor reads bypass ``torch.load``."""

    def __init__(
        self, path: str | os.PathLike[str], before_read: Callable[[], None] | None = None
    ) -> None:
        super().__init__(path)
        # Runs before the first byte is read into place (rank.py: the digest gate).
        self._before_read = before_read
        self.direct_items = 0
        self.stock_items = 0
        self._layouts: list[tuple[int, bytes, torch.Tensor, int]] = []

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Any:
        if self._before_read is not None:
            self._before_read()
        per_file: dict[str, list[ReadItem]] = defaultdict(list)
        for item in plan.items:
            per_file[self.storage_data[item.storage_index].relative_path].append(item)
        stock: list[ReadItem] = []
        for rel, items in per_file.items():
            fd = os.open(os.path.join(self.path, rel), os.O_RDONLY)
            try:
                # In file order: a sequential read when the page cache is cold.
                for item in sorted(items, key=lambda i: self.storage_data[i.storage_index].offset):
                    if not self._read_direct(fd, item, planner):
                        stock.append(item)
            finally:
                os.close(fd)
        self.direct_items += len(plan.items) - len(stock)
        self.stock_items += len(stock)
        return super().read_data(LoadPlan(stock), planner)

    def _read_direct(self, fd: int, item: ReadItem, planner: LoadPlanner) -> bool:
        info = self.storage_data[item.storage_index]
        if item.type != LoadItemType.TENSOR or info.transform_descriptors:
            return False
        target = planner.resolve_tensor(item).detach()
        if target.device.type != "cpu" or not target.is_contiguous():
            return False
        layout = self._layout(fd, info.offset, info.length)
        if layout is None:
            return False
        saved, data_at = layout
        if saved.dtype != target.dtype or not saved.is_contiguous() or saved.storage_offset() != 0:
            return False
        start = _row_run(tuple(saved.shape), tuple(item.storage_offsets), tuple(item.lengths))
        if start is None or tuple(item.lengths) != tuple(target.shape):
            return False
        row_bytes = math.prod(saved.shape[1:]) * saved.element_size()
        _pread_exact(fd, _byte_view(target), info.offset + data_at + start * row_bytes)
        planner.commit_tensor(item, target)
        return True

    def _layout(self, fd: int, offset: int, length: int) -> tuple[torch.Tensor, int] | None:
        """The saved tensor (on the meta device) and where its data starts in the item.

        Two items whose bytes agree up to the data record and that have the same
        length are the same zip layout (the pickle, byte order and record headers
        all come first), so ``torch.load`` runs once per distinct layout: a file
        of the same few shapes (weights, both Adam moments) costs a handful of
        parses instead of one per tensor.
        """
        window = _Window(fd, offset, length)
        for known_length, prefix, saved, data_at in self._layouts:
            if known_length == length and window.head.startswith(prefix):
                return saved, data_at
        saved = torch.load(cast(IO[bytes], window), map_location="meta", weights_only=True)
        # Where torch.load found the data record (a private attribute: None -> stock path).
        found = getattr(saved.untyped_storage(), "_checkpoint_offset", None)
        if not isinstance(found, int) or found > len(window.head):
            return None
        data_at = found
        self._layouts.append((length, window.head[:data_at], saved, data_at))
        return saved, data_at


def _row_run(
    shape: tuple[int, ...], offsets: tuple[int, ...], lengths: tuple[int, ...]
) -> int | None:
    """First row if the slice ``offsets``/``lengths`` of ``shape`` is whole rows, else None."""
    if len(shape) != len(offsets) or len(shape) != len(lengths):
        return None
    if not shape:
        return 0
    if any(o != 0 or n != s for o, n, s in zip(offsets[1:], lengths[1:], shape[1:], strict=True)):
        return None
    return offsets[0]
