"""Child processes that cannot outlive the testbed.

Every child gets its own process group (so its own children die with it) and
PR_SET_PDEATHSIG, so even a SIGKILLed launcher or test run leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("grpo_testbed")

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


@dataclass
class Managed:
    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    argv: tuple[str, ...] = ()
    env: dict[str, str] | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace_s: float = 10.0) -> None:
        if not self.alive():
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("%s ignored SIGTERM for %.0f s; killing it", self.name, grace_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)


# How a server module starts its program as one of its owner's (a Testbed's) processes:
# spawn(name, argv, env).
Spawn = Callable[[str, list[str], dict[str, str]], Managed]


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports free on loopback right now."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def spawn(name: str, argv: Sequence[str], log_dir: Path,
          env: dict[str, str] | None = None) -> Managed:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
            preexec_fn=die_with_parent,  # no threads hold locks at spawn time
        )
    return Managed(name, proc, log_path, tuple(argv), env)


def wait_until(what: str, check: object, timeout_s: float, procs: Sequence[Managed] = (),
               interval_s: float = 0.2) -> None:
    """Poll ``check()`` until truthy; fail early, with logs, if a watched process died."""
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while time.monotonic() < deadline:
        for p in procs:
            if not p.alive():
                raise RuntimeError(
                    f"{p.name} exited with code {p.proc.returncode} while waiting for {what}; "
                    f"last lines of {p.log_path}:\n{p.log_tail()}"
                )
        try:
            if check():
                return
        except Exception as exc:  # the thing is not up yet
            last_exc = exc
        time.sleep(interval_s)
    detail = "".join(f"\n--- {p.name} ({p.log_path}):\n{p.log_tail(15)}" for p in procs)
    raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}: {last_exc}{detail}")
