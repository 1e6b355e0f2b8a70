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

from grpo_api.contract import CONFIG_PATH, Env
from grpo_api.trainer_config import ObjectStoreConfig

from .sigterm import AttemptFiles

POLL_S = 1.0


def attempt_files(env: dict[str, str], config: Path = Path(CONFIG_PATH)
                  ) -> AttemptFiles | None:
    """This attempt's done marker and stop request from the operator's env (and, for a job
    without a claim, the store from the attempt's config file the pod mounts); None
    outside a GRPOJob's pod."""
    ckpt, attempt = env.get(Env.CHECKPOINT_DIR.value), env.get(Env.ATTEMPT.value)
    if not ckpt or attempt is None or not attempt.isdigit():
        return None
    return AttemptFiles.at(ckpt, env.get(Env.JOB_UID.value, ""), int(attempt),
                           _store(config))


def _store(config: Path) -> ObjectStoreConfig | None:
    """checkpoint.store of the attempt's config, if any (read as it is: the hook imports
    none of the trainer's config machinery)."""
    import yaml

    try:
        raw = yaml.safe_load(config.read_text()) or {}
    except OSError:
        return None
    store = (raw.get("checkpoint") or {}).get("store")
    return ObjectStoreConfig.model_validate(store) if store else None


def wait_for_driver(marker: Path | Callable[[], bool], timeout_s: float,
                    clock: Callable[[], float] = time.monotonic,
                    sleep: Callable[[float], None] = time.sleep) -> bool:
    """True once `marker` exists (or says so), False when `timeout_s` passed first."""
    done = marker.exists if isinstance(marker, Path) else marker
    end = clock() + timeout_s
    while not done():
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
    if not files.is_done():  # the driver still runs: it may not know the pod goes
        files.request_stop(os.environ.get("HOSTNAME", "a worker pod"))
    done = wait_for_driver(files.is_done, args.timeout)
    # The kubelet keeps a failed hook's output in the pod's events: say what happened.
    print(f"preStop: {'driver done' if done else 'no driver marker'} after "
          f"{time.monotonic() - t0:.0f} s ({files.done})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
