"""Reading a dead rank's stacks file (liveness/rank_crash.py) on real faulthandler output:
a process that aborted, and a file holding only the stall probe's dumps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from grpo_trainer.liveness.rank_crash import fatal_crash

ABORT = """
import faulthandler, os, sys
f = open(sys.argv[1], "a")
faulthandler.dump_traceback(f, all_threads=True)  # a stall probe's dump first
f.flush()
faulthandler.enable(file=f, all_threads=True)
def load_the_batch():
    os.abort()
load_the_batch()
"""


def test_an_abort_outside_a_collective_is_named_a_crash_with_its_frame(tmp_path: Path) -> None:
    stacks = tmp_path / "rank1.txt"
    script = tmp_path / "crash.py"
    script.write_text(ABORT)
    run = subprocess.run([sys.executable, str(script), str(stacks)], capture_output=True)
    assert run.returncode != 0
    crash = fatal_crash(stacks.read_text())
    assert crash is not None and crash.signal == "Aborted"
    assert crash.collective is None
    message = crash.message(1, str(stacks))
    assert "not in a collective" in message and str(stacks) in message


def test_only_probe_dumps_are_no_crash(tmp_path: Path) -> None:
    stacks = tmp_path / "rank0.txt"
    code = ("import faulthandler, sys; f = open(sys.argv[1], 'a');"
            " faulthandler.dump_traceback(f, all_threads=True)")
    subprocess.run([sys.executable, "-c", code, str(stacks)], check=True)
    assert stacks.read_text().strip()
    assert fatal_crash(stacks.read_text()) is None
    assert fatal_crash("") is None
