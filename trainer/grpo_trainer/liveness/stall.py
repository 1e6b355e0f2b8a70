"""Stall detection, the pure half: progress marks, the effective timeout, reading stacks.

A hung job (a collective that never returns, a rank stopped or stuck in a data loader)
would otherwise stay Running and burn its GPUs. The driver marks progress (every stage
of a step and every finished step, ``Heartbeat``); the monitor (``stall_monitor``) ends
the run when nothing moved for ``effective_timeout_s``, after capturing every rank's
Python stacks (faulthandler's text, parsed here) and naming the rank and the innermost
frame of ours it is stuck in.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from grpo_api.contract import STALL_STEP_MULTIPLE

# Steps not measured for the timeout: the first ones start the rollout engine, compile
# and fill allocator caches, and would make the measured step look slower than it is.
STALL_WARMUP_STEPS = 2

# Frames in files under this directory are "ours" (the trainer's own code): the
# grpo_trainer package, of which this module sits in the liveness subpackage.
PACKAGE_DIR = str(Path(__file__).resolve().parent.parent)


def effective_timeout_s(configured_s: float, step_seconds: Sequence[float]) -> float:
    """The larger of the configured timeout and ``STALL_STEP_MULTIPLE`` x the median
    measured step time after ``STALL_WARMUP_STEPS`` (the configured one until then)."""
    measured = list(step_seconds[STALL_WARMUP_STEPS:])
    if not measured:
        return configured_s
    return max(configured_s, STALL_STEP_MULTIPLE * statistics.median(measured))


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} {self.function}"


@dataclass(frozen=True)
class ThreadStack:
    """One thread, its frames innermost first (faulthandler's order)."""

    name: str
    frames: tuple[Frame, ...]
    current: bool = False  # the thread that handled the dump signal: the main thread


_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)")
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')


def parse_faulthandler(text: str) -> list[ThreadStack]:
    """Threads of a ``faulthandler`` dump (``dump_traceback(all_threads=True)``)."""
    threads: list[ThreadStack] = []
    name: str | None = None
    current = False
    frames: list[Frame] = []

    def flush() -> None:
        if name is not None:
            threads.append(ThreadStack(name, tuple(frames), current))

    for line in text.splitlines():
        if m := _THREAD.match(line):
            flush()
            name, current, frames = m.group(2), m.group(1) == "Current thread", []
        elif (m := _FRAME.match(line)) and name is not None:
            lineno = int(m.group(2)) if m.group(2).isdigit() else 0
            frames.append(Frame(m.group(1), lineno, m.group(3).strip()))
    flush()
    return threads


def is_ours(frame: Frame, package_dir: str = PACKAGE_DIR) -> bool:
    return frame.file.startswith(package_dir + "/")


def innermost_ours(threads: Sequence[ThreadStack], package_dir: str = PACKAGE_DIR) -> Frame | None:
    """Where a process is stuck, in our terms: the innermost frame in our package, on the
    main thread (the one running the rank's method) if it has one, else on any thread."""
    ordered = sorted(threads, key=lambda t: not t.current)
    for t in ordered:
        for f in t.frames:
            if is_ours(f, package_dir):
                return f
    return None


@dataclass(frozen=True)
class RankStacks:
    """What the probe got from one rank: its dump, or why there is none."""

    rank: int
    text: str | None  # faulthandler's dump; None: it did not answer
    error: str = ""  # why not

    @property
    def threads(self) -> list[ThreadStack]:
        return parse_faulthandler(self.text) if self.text else []


def choose_stuck(stacks: Sequence[RankStacks], waiting: Sequence[int]) -> int | None:
    """The rank to name: one that did not answer (stopped, or its node gone), else the
    first one the driver is still waiting on, else None."""
    silent = [s.rank for s in stacks if s.text is None]
    if silent:
        return min(silent)
    return min(waiting) if waiting else None


@dataclass(frozen=True)
class StallVerdict:
    rank: int | None
    frame: Frame | None
    stage: str
    idle_s: float
    timeout_s: float
    silent: tuple[int, ...]
    probe_timeout_s: float
    waiting: tuple[int, ...] = ()  # ranks whose call had not returned

    def message(self) -> str:
        """One line for the log and the termination message."""
        head = (f"no progress for {self.idle_s:.0f} s (timeout {self.timeout_s:.0f} s) in "
                f"stage {self.stage}")
        if self.rank is None:
            return f"{head}: no rank is busy (the driver itself is stuck)"
        if self.rank in self.silent:
            where = f"rank {self.rank} did not answer within {self.probe_timeout_s:.0f} s " \
                    "(stopped, or its node is gone)"
        else:
            where = f"rank {self.rank} is stuck"
            where += f" at {self.frame}" if self.frame else " outside the trainer's code"
        return f"{head}: {where}"


class StallError(RuntimeError):
    """The run made no progress for the stall timeout (exit 6, Hang)."""

    def __init__(self, v: StallVerdict, stacks_path: Path | None) -> None:
        where = f"; every rank's stacks: {stacks_path}" if stacks_path else ""
        super().__init__(v.message() + where)
        self.verdict = v
        self.stacks_path = stacks_path


def verdict(stacks: Sequence[RankStacks], waiting: Sequence[int], stage: str, idle_s: float,
            timeout_s: float, probe_timeout_s: float) -> StallVerdict:
    rank = choose_stuck(stacks, waiting)
    by_rank = {s.rank: s for s in stacks}
    frame = innermost_ours(by_rank[rank].threads) if rank in by_rank else None
    silent = tuple(sorted(s.rank for s in stacks if s.text is None))
    return StallVerdict(rank, frame, stage, idle_s, timeout_s, silent, probe_timeout_s,
                        tuple(waiting))


def report_text(v: StallVerdict, stacks: Sequence[RankStacks], driver: str) -> str:
    """The stacks file: the verdict, each rank's innermost frame of ours, every dump."""
    lines = [v.message(), ""]
    for s in sorted(stacks, key=lambda s: s.rank):
        if s.text is None:
            lines.append(f"rank {s.rank}: did not answer within {v.probe_timeout_s:.0f} s"
                         f"{' (' + s.error + ')' if s.error else ''}")
        elif s.rank not in v.waiting:  # in Ray's task loop, waiting for the next call
            lines.append(f"rank {s.rank}: idle (its call had returned)")
        else:
            f = innermost_ours(s.threads)
            lines.append(f"rank {s.rank}: {f if f else 'no frame of the trainer'}")
    for s in sorted(stacks, key=lambda s: s.rank):
        if s.text is not None:
            lines += ["", f"=== rank {s.rank} (most recent call first) ===", trim(s.text)]
    lines += ["", "=== driver (most recent call first) ===", trim(driver), ""]
    return "\n".join(lines)


_NATIVE_ONLY = re.compile(r"^Thread 0x[0-9a-fA-F]+ \(most recent call first\):\n"
                          r"  <no Python frame>\n\n?", re.M)


def trim(dump: str) -> str:
    """A dump without the threads that run no Python (the runtime's own, a dozen per
    process), counted at the end."""
    kept, n = _NATIVE_ONLY.subn("", dump)
    return kept.rstrip() + (f"\n\n(and {n} threads with no Python frame)" if n else "")


@dataclass
class Heartbeat:
    """The driver's progress marks: the stage it is in, since when, and step times.

    Written by the training loop, read by the monitor thread (a lock keeps the pair
    consistent); ``waiting`` is the ranks whose current call has not returned.
    ``published`` gets every mark too (outside the lock): the progress report's stage,
    which the operator's own progress deadline watches."""

    current: str = "start"  # the stage it is in
    since: float = field(default_factory=time.monotonic)
    step_seconds: list[float] = field(default_factory=list)
    waiting: tuple[int, ...] = ()
    published: Callable[[str], None] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def mark(self, stage: str) -> None:
        with self._lock:
            self.current, self.since = stage, time.monotonic()
        if self.published is not None:
            self.published(stage)

    @contextmanager
    def stage(self, stage: str, times: dict[str, float] | None = None) -> Iterator[None]:
        """A stage of the step: marked for the stall monitor and the progress report,
        and, given ``times``, its seconds recorded there as ``time/<stage>_s``."""
        self.mark(stage)
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if times is not None:
                times[f"time/{stage}_s"] = time.perf_counter() - t0

    def step_done(self, step: int, seconds: float) -> None:
        with self._lock:
            self.step_seconds.append(seconds)
            self.current, self.since = f"after step {step}", time.monotonic()

    def set_waiting(self, ranks: Sequence[int]) -> None:
        self.waiting = tuple(ranks)

    def read(self) -> tuple[str, float, list[float], tuple[int, ...]]:
        with self._lock:
            return self.current, self.since, list(self.step_seconds), self.waiting
