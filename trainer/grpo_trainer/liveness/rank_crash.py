"""A rank whose process died of a fatal signal inside a collective: what it was doing.

Ranks that issue different collectives (a unit one rank skips, a tensor of another size)
do not get a Python error: gloo aborts the process from C++ (``terminate called after
throwing an instance of 'gloo::EnforceNotMet'``, ``op.preamble.length <= op.nbytes``) and
NCCL corrupts or hangs. Ray then reports the rank's actor as dead, which alone reads like
a lost node (NodeLost, retried as if the hardware were at fault). Each rank therefore has
``faulthandler`` write its stacks on a fatal signal into its stacks file
(``stall_monitor.install_stack_dump``); when a rank's actor dies the driver reads that
file, and a fatal dump whose innermost torch.distributed frame is a collective makes the
failure a ``RankCrashed``: a trainer error (exit 1), its message naming the collective.
A process killed by SIGKILL (the kernel's OOM killer, a node or pod gone) writes nothing
and stays what it was. Pure: no I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .stall import Frame, innermost_ours, is_ours, parse_faulthandler

# faulthandler's header for a fatal signal (Python 3.11: "Fatal Python error: Aborted").
_FATAL = re.compile(r"^Fatal Python error: (.+)$", re.MULTILINE)
_DISTRIBUTED = "/torch/distributed/"


class RankCrashed(RuntimeError):
    """A rank's process died of a fatal signal (not a lost node): a trainer error."""


@dataclass(frozen=True)
class Crash:
    signal: str  # faulthandler's name for it: "Aborted", "Segmentation fault"
    collective: Frame | None  # the innermost torch.distributed frame, if in one
    caller: Frame | None  # the innermost frame outside torch.distributed

    def message(self, rank: int, stacks_file: str) -> str:
        if self.collective is None:
            where = f" at {self.caller}" if self.caller is not None else ""
            return (f"rank {rank}'s process died ({self.signal}){where}, not in a collective:"
                    " a crash of the trainer or a library, not a lost node; every thread's stack"
                    f" is in {stacks_file} on its node")
        via = f", called from {self.caller}" if self.caller is not None else ""
        return (f"rank {rank}'s process died ({self.signal}) inside the collective "
                f"{self.collective.function} ({self.collective}{via}): the ranks issued "
                "different collectives (a unit one rank skipped, or tensors of other sizes). "
                f"A trainer defect, not a lost node; every thread's stack is in {stacks_file} "
                "on its node")


def fatal_crash(text: str) -> Crash | None:
    """The last fatal-signal dump in a rank's stacks file, or None (no fatal dump: the
    file holds only the stall probe's dumps, or nothing). gloo aborts from a thread of its
    own, which has no Python frame: the collective is found on whichever thread waits in
    torch.distributed (the signalled thread first), the caller is the innermost frame of
    the trainer's own code outside it."""
    found = list(_FATAL.finditer(text))
    if not found:
        return None
    last = found[-1]
    threads = sorted(parse_faulthandler(text[last.end():]), key=lambda t: not t.current)
    for thread in threads:
        frames = thread.frames
        at = next((i for i, f in enumerate(frames) if _DISTRIBUTED in f.file), None)
        if at is not None:
            outer = [f for f in frames[at:] if _DISTRIBUTED not in f.file]
            caller = next((f for f in outer if is_ours(f)), outer[0] if outer else None)
            return Crash(last.group(1).strip(), frames[at], caller)
    return Crash(last.group(1).strip(), None, innermost_ours(threads))
