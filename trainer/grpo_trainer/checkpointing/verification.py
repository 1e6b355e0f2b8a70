"""A rank's check of the checkpoint files it was given, before its load writes anything.

The digests are computed in background threads (files in parallel); ``wait`` gathers
every rank's problems, so all ranks decide alike, and ``gate`` is the reader's hook that
holds the load's first write until then.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch.distributed as dist

from .files import digest_file
from .tracker import digest_problems, from_wire


class Verification:
    """This rank's share of the digests, computed in background threads.

    ``wait`` is collective: it gathers every rank's problems, so all ranks decide
    alike; it runs once and then returns the same verdict.
    """

    def __init__(self, root: Path, verify: dict[str, list[Any]], threads: int, pg: Any,
                 problems: list[str] | None = None) -> None:
        self._pg = pg
        self._expected = {k: from_wire(v) for k, v in verify.items()}
        self._problems = list(problems or ())  # found before (a fetch from the store)
        present = [k for k in self._expected if (root / k).exists()]
        # Files in parallel: reads and both hashes release the GIL.
        self._pool = ThreadPoolExecutor(threads)
        self._futures = {
            k: self._pool.submit(digest_file, root / k, self._expected[k].algorithm)
            for k in present
        }
        self._bad: list[str] | None = None
        self.finished = 0.0

    def wait(self) -> list[str]:
        if self._bad is None:
            try:
                actual = {k: f.result() for k, f in self._futures.items()}
            finally:
                self._pool.shutdown(cancel_futures=True)
            mine = self._problems + digest_problems(self._expected, actual)
            everyone: list[Any] = [None] * dist.get_world_size(self._pg)
            dist.all_gather_object(everyone, mine, group=self._pg)
            self._bad = sorted({p for probs in everyone for p in probs})
            self.finished = time.perf_counter()
        return self._bad

    def gate(self) -> None:
        """Called by the reader before it writes anything: raises if any rank found damage."""
        if self.wait():
            raise CorruptCheckpoint("; ".join(self.wait()))


class CorruptCheckpoint(Exception):
    """A file's digest or size does not match the manifest (the message names it)."""
