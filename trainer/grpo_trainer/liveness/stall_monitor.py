"""Stall detection, the edges: each rank's stack dump, the probe, the monitor thread.

A rank that hangs cannot answer a Ray method call (an actor runs one method at a time,
and the stuck one never returns), so each rank registers ``faulthandler`` on
``STACKS_SIGNAL`` at start: the kernel runs its C handler, which appends every thread's
Python stack to the rank's stacks file, even while the rank sits in a collective or in C
code holding the GIL. The probe signals the ranks of a node from a process on that node
(the driver itself, or a zero-CPU Ray task pinned there) and reads what each appended; a
rank stopped with SIGSTOP writes nothing, and is named as not answering.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from grpo_api.contract import ExitCode, FailureReason

from .stall import (
    Heartbeat,
    RankStacks,
    StallError,
    effective_timeout_s,
    report_text,
    verdict,
)
from .termination import termination_message, write_termination

log = logging.getLogger(__name__)

# SIGUSR1 is Ray Tune's, and Ray's dashboard agent uses SIGUSR2 only in its own process.
STACKS_SIGNAL = signal.SIGUSR2
# How long a signalled rank has to write its dump: faulthandler writes at once, so a rank
# silent this long is stopped (or its process is gone).
DUMP_WAIT_S = 10.0
# A probe task on another node may first need a Ray worker process started there.
REMOTE_PROBE_EXTRA_S = 60.0
# After the verdict, how long the training loop has to notice it and end the run the
# normal way (it polls every RAY_POLL_S); past that the monitor ends the process itself.
FORCE_EXIT_AFTER_S = 60.0
RAY_POLL_S = 1.0

_stacks_file: TextIO | None = None  # kept open for faulthandler's C handler


def install_stack_dump(rank: int) -> str:
    """In a rank's process: dump every thread's stack to a file on ``STACKS_SIGNAL``."""
    global _stacks_file
    if _stacks_file is None:
        d = Path(tempfile.gettempdir()) / "grpo-stacks"
        d.mkdir(exist_ok=True)
        # Append mode: each dump lands at the end, where the probe reads from.
        _stacks_file = open(d / f"rank{rank}-{os.getpid()}.txt", "a")  # noqa: SIM115
        faulthandler.register(STACKS_SIGNAL, file=_stacks_file, all_threads=True, chain=False)
        # A fatal signal's stacks too (gloo aborts on mismatched collectives): the driver
        # reads them when Ray reports the rank dead (rank_crash.py). In place of Ray's own
        # faulthandler, which wrote the signalled thread's stack only, to the worker log.
        faulthandler.enable(file=_stacks_file, all_threads=True)
    return _stacks_file.name


@dataclass(frozen=True)
class RankTarget:
    rank: int
    pid: int
    node_id: str | None
    stacks_file: str


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return -1


def dump_local(targets: list[RankTarget], wait_s: float) -> list[RankStacks]:
    """Signal each rank (all on this node) and read the dump it appended, if any."""
    start = {t.rank: _size(t.stacks_file) for t in targets}
    errors: dict[int, str] = {}
    for t in targets:
        try:
            os.kill(t.pid, STACKS_SIGNAL)
        except OSError as err:
            errors[t.rank] = f"pid {t.pid}: {err.strerror}"
    deadline = time.monotonic() + wait_s
    texts: dict[int, str] = {}
    while len(texts) + len(errors) < len(targets) and time.monotonic() < deadline:
        time.sleep(0.2)
        for t in targets:
            if t.rank in texts or t.rank in errors:
                continue
            size = _size(t.stacks_file)
            if size > start[t.rank]:
                time.sleep(0.2)  # let the handler finish its write
                with open(t.stacks_file) as f:
                    f.seek(start[t.rank])
                    texts[t.rank] = f.read()
    return [RankStacks(t.rank, texts.get(t.rank), errors.get(t.rank, "")) for t in targets]


def capture(targets: list[RankTarget], wait_s: float = DUMP_WAIT_S) -> list[RankStacks]:
    """Every rank's stacks: this node's ranks from here, other nodes' from a probe task."""
    return _on_their_nodes(targets, dump_local, wait_s, wait_s)


# A rank's stacks file holds its probe dumps and, at the end, a fatal signal's dump: the
# tail is enough (faulthandler writes at most 100 frames a thread).
FATAL_TAIL_BYTES = 256 * 1024


def read_local(targets: list[RankTarget]) -> list[RankStacks]:
    """The tail of each rank's stacks file (this node's ranks), without signalling them:
    for a rank that is gone, whatever faulthandler wrote as it died."""
    out = []
    for t in targets:
        try:
            with open(t.stacks_file, "rb") as f:
                f.seek(max(0, _size(t.stacks_file) - FATAL_TAIL_BYTES))
                out.append(RankStacks(t.rank, f.read().decode(errors="replace")))
        except OSError as err:
            out.append(RankStacks(t.rank, None, f"{t.stacks_file}: {err.strerror}"))
    return out


def read_stacks_files(targets: list[RankTarget]) -> list[RankStacks]:
    """``read_local`` for ranks on any node (a probe task on each other node)."""
    return _on_their_nodes(targets, read_local, 0.0)


def _on_their_nodes(targets: list[RankTarget], fn: Any, wait_s: float, *args: Any
                    ) -> list[RankStacks]:
    """``fn(node's targets, *args)`` for this node's ranks here and for each other node's
    in a task pinned to it (a gone node's ranks get the probe's failure as their error)."""
    import ray

    here = ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    by_node: dict[str, list[RankTarget]] = {}
    for t in targets:
        if t.node_id is not None and t.node_id != here:
            by_node.setdefault(t.node_id, []).append(t)
    out: list[RankStacks] = fn([t for t in targets if t.node_id is None or t.node_id == here],
                               *args)
    if not by_node:
        return out
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe: Any = ray.remote(num_cpus=0)(fn)
    refs = {
        node: probe.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
        ).remote(ts, *args)
        for node, ts in by_node.items()
    }
    for node, ref in refs.items():
        try:
            out += ray.get(ref, timeout=wait_s + REMOTE_PROBE_EXTRA_S)
        except Exception as err:  # the node is gone, or its raylet does not answer
            out += [RankStacks(t.rank, None, f"probe on node {node} failed: {err}")
                    for t in by_node[node]]
    return out


def driver_stacks() -> str:
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(f, all_threads=True)
        f.seek(0)
        return f.read()


class StallMonitor:
    """A thread in the driver: ends the run when the heartbeat stops for the timeout.

    The training loop's Ray waits call ``check`` (every ``RAY_POLL_S``), which raises the
    ``StallError`` once the monitor has captured the stacks; a loop stuck elsewhere is
    ended by the monitor itself after ``FORCE_EXIT_AFTER_S``."""

    def __init__(self, heartbeat: Heartbeat, timeout_s: float, targets: list[RankTarget],
                 stalls_dir: Path | None, attempt: int, termination_log: Path,
                 last_checkpoint: Any = lambda: None,
                 force_exit_after_s: float = FORCE_EXIT_AFTER_S) -> None:
        self.heartbeat = heartbeat
        self.timeout_s = timeout_s
        self.targets = targets
        self.stalls_dir = stalls_dir
        self.attempt = attempt
        self.termination_log = termination_log
        self.last_checkpoint = last_checkpoint
        self.force_exit_after_s = force_exit_after_s
        self.error: StallError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="stall-monitor", daemon=True)

    def start(self) -> None:
        if self.stalls_dir is not None:
            # Made up front: the attempt after a Hang points NCCL's flight recorder dump
            # here (the operator's collective debug env), and torch does not create it.
            try:
                self.stalls_dir.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                log.warning("could not create %s: %s", self.stalls_dir, err)
        if self.timeout_s > 0:
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def check(self) -> None:
        if self.error is not None:
            raise self.error

    def waiting(self, ranks: list[int]) -> None:
        self.heartbeat.set_waiting(ranks)

    def _watch(self) -> None:
        while not self._stop.is_set():
            stage, since, steps, waiting = self.heartbeat.read()
            timeout = effective_timeout_s(self.timeout_s, steps)
            idle = time.monotonic() - since
            if idle >= timeout:
                self._trip(stage, idle, timeout, waiting)
                return
            self._stop.wait(min(max(timeout / 20, 0.5), 10.0, timeout - idle + 0.1))

    def _trip(self, stage: str, idle: float, timeout: float, waiting: tuple[int, ...]) -> None:
        log.error("no progress for %.0f s in stage %s: capturing every rank's stacks",
                  idle, stage)
        try:
            stacks = capture(self.targets)
        except Exception as err:  # Ray itself in trouble: the verdict must still come
            log.exception("the stack probe failed")
            stacks = [RankStacks(t.rank, None, f"probe failed: {err}") for t in self.targets]
        v = verdict(stacks, waiting, stage, idle, timeout, DUMP_WAIT_S)
        text = report_text(v, stacks, driver_stacks())
        path = self._write(text)
        log.error("STALL: %s\n%s", v.message(), text)
        self.error = StallError(v, path)
        if self._stop.wait(self.force_exit_after_s):
            return
        # The loop never came back to a Ray wait (stuck in the driver's own code).
        log.error("the training loop did not stop within %.0f s: exiting",
                  self.force_exit_after_s)
        write_termination(self.termination_log, termination_message(
            FailureReason.HANG, None, self.last_checkpoint(), str(self.error)))
        logging.shutdown()
        os._exit(int(ExitCode.HANG))

    def _write(self, text: str) -> Path | None:
        if self.stalls_dir is None:
            return None
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        path = self.stalls_dir / f"{self.attempt}-{stamp}.txt"
        try:
            self.stalls_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        except OSError as err:  # the log still has it
            log.error("could not write the stacks to %s: %s", path, err)
            return None
        log.error("every rank's stacks: %s", path)
        return path
