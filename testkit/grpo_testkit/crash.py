"""A fork server for crash tests: pay the imports once, SIGKILL many real trainers.

A fresh Python that imports torch + transformers takes 15-30 s on a busy CI box;
a fork of a process that already imported them starts in milliseconds. So the
server (``python -m grpo_testkit.crash``) imports everything, then for
each JSON line ``{"config": PATH, "log": PATH, "resume": true}`` on stdin forks
one child that runs the real driver loop (``GRPOTrainer`` + ``DCPCheckpointer``)
with the real ``Worker`` in-process (one rank, gloo) - everything but Ray's
transport - and prints ``{"pid": N}``, then ``{"pid": N, "status": S}`` when that
child ends (S: exit code, or minus the signal that killed it). The test kills
children however it likes.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from grpo_trainer.driver.worker_group import Watch
from grpo_trainer.liveness.stall_monitor import RankTarget
from grpo_trainer.rank_api import R


class LocalGroup:
    """``WorkerGroup``'s interface over in-process workers: one rank, no Ray."""

    def __init__(self, cfg: Any) -> None:
        from grpo_trainer.cluster.devices import free_port
        from grpo_trainer.rank.worker import Worker

        self.world_size = 1
        self.workers = [Worker(cfg, 0, 1)]
        self.info = [self.workers[0].setup("127.0.0.1", free_port())]
        self.transport: dict[str, Any] | None = None  # one process: no NCCL to report
        # No process of its own to probe for stacks, nothing for the monitor to watch.
        self.targets: list[RankTarget] = []
        self.watch: Watch | None = None

    def call(self, method: Callable[..., R], *per_rank_args: Sequence[Any],
             common: Sequence[Any] = ()) -> list[R]:
        return [
            getattr(w, method.__name__)(*[a[rank] for a in per_rank_args], *common)
            for rank, w in enumerate(self.workers)
        ]

    def shutdown(self) -> None:
        for w in self.workers:
            w.shutdown()


def run_local(config_path: str, *, resume: bool = True) -> None:
    """Train in this process with a ``LocalGroup`` (what each forked child does)."""
    from grpo_trainer.checkpointing import make_checkpointer
    from grpo_trainer.config import load_config
    from grpo_trainer.driver.driver import GRPOTrainer

    cfg = load_config(config_path)
    trainer = GRPOTrainer(cfg, checkpointer=make_checkpointer(cfg, resume=resume))
    group = LocalGroup(cfg)
    trainer.group = group  # type: ignore[assignment]
    trainer.step = trainer.checkpointer.restore(group, trainer.loader)
    trainer.run()
    trainer.close()


def _child(request: dict[str, Any]) -> None:
    fd = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        force=True,
    )
    code = 0
    try:
        run_local(request["config"], resume=bool(request.get("resume", True)))
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _preload() -> None:
    """Everything a child imports, so that the fork inherits it."""
    import numpy  # noqa: F401
    import torch
    import torch.distributed.checkpoint
    import torch.distributed.checkpoint.state_dict
    import torch.distributed.fsdp  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    from transformers.models.qwen2 import modeling_qwen2  # noqa: F401

    from grpo_trainer.checkpointing import dcp, export, rank  # noqa: F401
    from grpo_trainer.driver import driver  # noqa: F401
    from grpo_trainer.rank import worker  # noqa: F401


def serve() -> None:
    _preload()
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        # The log exists before the child runs: a kill in its first milliseconds (the
        # crash test's random aim) leaves an empty log, not a missing one.
        Path(request["log"]).touch()
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        print(json.dumps({"pid": pid, "status": code}), flush=True)


class CrashServer:
    """The test's handle on a running fork server."""

    def __init__(self, startup_timeout_s: float = 300.0) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "grpo_testkit.crash"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self._lines: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self._next(startup_timeout_s)  # {"ready": true}
        self.pid: int | None = None
        self.started = 0.0

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                self._lines.put(json.loads(line))

    def _next(self, timeout: float | None) -> dict[str, Any]:
        return self._lines.get(timeout=timeout)

    def start(self, config: Path, log: Path, *, resume: bool = True) -> int:
        assert self.proc.stdin is not None
        request = {"config": str(config), "log": str(log), "resume": resume}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        self.started = time.monotonic()
        self.pid = int(self._next(60)["pid"])
        return self.pid

    def poll(self) -> int | None:
        """The child's exit status if it has ended, else None."""
        try:
            return int(self._next(0)["status"])
        except queue.Empty:
            return None

    def wait(self, timeout: float = 300.0) -> int:
        return int(self._next(timeout)["status"])

    def kill(self) -> bool:
        """SIGKILL the running child; False if it had already ended."""
        assert self.pid is not None
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    serve()


# Metric prefixes that differ between an interrupted run and an uninterrupted one.
VOLATILE_METRICS = ("time/", "throughput/", "memory/")


def step_metrics(log: Path) -> dict[int, dict[str, Any]]:
    """Per-step metric lines of a crash-test child's log, without the volatile ones."""
    out = {}
    for line in log.read_text().splitlines():
        if line.startswith('{"step"') and line.endswith("}"):  # a kill may cut the last line
            m = json.loads(line)
            out[m["step"]] = {k: v for k, v in m.items() if not k.startswith(VOLATILE_METRICS)}
    return out


def crash_run_config(tmp: Path, model: Path, data: Path, name: str, *, steps: int,
                     keep: int = 2, actor: dict[str, Any] | None = None,
                     async_save: bool = False) -> Path:
    """A one-rank text run checkpointing every step, written to ``tmp/<name>.yaml``."""
    import yaml

    from .configs import text_config

    cfg = text_config(
        model,
        data,
        actor=actor or {},
        checkpoint={"dir": str(tmp / name), "interval_steps": 1, "keep": keep,
                    "async_save": async_save},
        trainer={"total_steps": steps, "rollout_batch_size": 2},
        rollout={"n": 4},
        resources={"num_workers": 1},
    )
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path
