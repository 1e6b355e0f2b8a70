"""Durable file writes and checksums: the thin I/O edge under the checkpoint layout.

A crash may stop the process between any two system calls. Files that mark a
state (the complete marker, the tracker) are therefore written to a temporary
name, fsynced, renamed over the final name, and the directory is fsynced so the
rename itself survives a power cut; data files are fsynced before anything that
points at them is written. Checksums are computed while bytes are written
(``HashingWriter``), so a save never reads its own files back.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from types import TracebackType
from typing import BinaryIO, Protocol

import xxhash

from .tracker import HASH_ALGORITHM, MANIFEST, FileEntry, HashAlgorithm

CHUNK = 8 * 1024 * 1024


class Hash(Protocol):
    def update(self, data: bytes | bytearray | memoryview, /) -> None: ...
    def hexdigest(self) -> str: ...


def new_hash(algorithm: HashAlgorithm) -> Hash:
    """A streaming hash; both release the GIL on large buffers, so threads overlap."""
    if algorithm == "xxh3_128":
        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown checkpoint digest algorithm {algorithm!r}")


class HashingWriter:
    """A write-only stream that feeds every byte to the hash on its way to ``raw``."""

    def __init__(self, raw: BinaryIO, algorithm: HashAlgorithm = HASH_ALGORITHM) -> None:
        self._raw = raw
        self._algorithm: HashAlgorithm = algorithm
        self._hash = new_hash(algorithm)
        self.size = 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        view = memoryview(data)
        self._raw.write(view)
        self._hash.update(view)
        self.size += view.nbytes
        return view.nbytes

    def tell(self) -> int:
        return self._raw.tell()

    def flush(self) -> None:
        self._raw.flush()

    def fileno(self) -> int:
        return self._raw.fileno()

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False  # a seek would make the running digest wrong

    @property
    def closed(self) -> bool:
        return self._raw.closed

    def close(self) -> None:
        self._raw.close()

    def entry(self) -> FileEntry:
        return FileEntry(self.size, self._hash.hexdigest(), self._algorithm)

    def __enter__(self) -> HashingWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def fsync_dir(path: str | Path) -> None:
    """Make a directory's entries (creates, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: str | Path, data: bytes) -> FileEntry:
    """Write ``data`` to ``path`` and fsync it; returns its size and digest."""
    with open(path, "wb") as raw:
        h = HashingWriter(raw)
        h.write(data)
        raw.flush()
        os.fsync(raw.fileno())
    return h.entry()


def atomic_write(path: str | Path, data: bytes) -> FileEntry:
    """Replace ``path`` with ``data`` so a reader sees the old or the new bytes, never a mix."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    entry = write_durable(tmp, data)
    os.replace(tmp, path)
    fsync_dir(path.parent)
    return entry


def digest_file(path: str | Path, algorithm: HashAlgorithm = HASH_ALGORITHM) -> FileEntry:
    """Size and digest of a file, read once in large chunks."""
    h = new_hash(algorithm)
    size = 0
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(CHUNK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
    return FileEntry(size, h.hexdigest(), algorithm)


def file_size(path: str | Path) -> int | None:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def remove_step_dir(path: str | Path) -> None:
    """Delete a step directory, its complete marker first.

    A crash halfway through leaves a directory without a marker (cleaned up on
    the next start), never one that looks complete but misses files.
    """
    path = Path(path)
    try:
        (path / MANIFEST).unlink()
        fsync_dir(path)
    except FileNotFoundError:
        pass
    shutil.rmtree(path, ignore_errors=True)
