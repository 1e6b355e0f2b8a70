"""A worker pod's preStop hook: keep Ray on this node up until the driver is done.

When a worker pod is deleted (a preemption or suspend deletes every pod, a drain or an
eviction this one), the kubelet runs this hook before it sends SIGTERM to the worker
container's `ray start --block`, whose exit takes the node's raylet and ranks with it.
The hook first writes the attempt's stop request (``driver_stop_request``, with this
pod's name): a drain sends the driver no SIGTERM of its own, and the request makes it
stop as if it had. The driver commits a checkpoint of its last finished step with those
ranks and then writes its done marker (``driver_done_marker``); this hook returns once
the marker is there, or after ``--timeout`` seconds (the operator passes the pods' grace
period less Ray's shutdown time), whichever comes first. Outside a GRPOJob's pod it
returns at once.

    python -m grpo_trainer.liveness.prestop --timeout 300
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from grpo_api.contract import Env

from .sigterm import AttemptFiles

POLL_S = 1.0


def attempt_files(env: dict[str, str]) -> AttemptFiles | None:
    """This attempt's done marker and stop request from the operator's env; None outside
    a GRPOJob's pod."""
    ckpt, attempt = env.get(Env.CHECKPOINT_DIR.value), env.get(Env.ATTEMPT.value)
    if not ckpt or attempt is None or not attempt.isdigit():
        return None
    return AttemptFiles.at(ckpt, env.get(Env.JOB_UID.value, ""), int(attempt))


def wait_for_driver(marker: Path, timeout_s: float,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> bool:
    """True once `marker` exists, False when `timeout_s` passed first."""
    end = clock() + timeout_s
    while not marker.exists():
        left = end - clock()
        if left <= 0:
            return False
        sleep(min(POLL_S, left))
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_trainer.liveness.prestop")
    parser.add_argument("--timeout", type=float, required=True,
                        help="seconds to wait at most for the driver's done marker")
    args = parser.parse_args(argv)
    files = attempt_files(dict(os.environ))
    if files is None:
        return 0
    t0 = time.monotonic()
    if not files.done.exists():  # the driver still runs: it may not know the pod goes
        files.request_stop(os.environ.get("HOSTNAME", "a worker pod"))
    done = wait_for_driver(files.done, args.timeout)
    # The kubelet keeps a failed hook's output in the pod's events: say what happened.
    print(f"preStop: {'driver done' if done else 'no driver marker'} after "
          f"{time.monotonic() - t0:.0f} s ({files.done})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
