"""Training entry point with the exit-code contract around it."""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from grpo_api.contract import TERMINATION_LOG, ExitCode, FailureReason

from .checkpointing.model_guard import check_same_model
from .config import check_runtime, load_config
from .config_error import ConfigError
from .errors import classify, step_of
from .liveness.sigterm import AttemptFiles
from .liveness.termination import termination_log_path, termination_message, write_termination

log = logging.getLogger("grpo_trainer")


def run_training(config_path: str, overrides: Sequence[str] = (), *, resume: bool = True) -> int:
    """Train, resuming from the newest complete checkpoint in ``checkpoint.dir`` if ``resume``."""
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    term_path = termination_log_path()
    try:
        cfg = load_config(config_path, overrides)
        term_path = termination_log_path(cfg.trainer.termination_log)
        check_runtime(cfg)
        if resume:
            check_same_model(cfg)
    except ConfigError as err:
        # Before anything touches Ray or the checkpoint directory: never retried.
        print(f"config error: {err}", file=sys.stderr)
        write_termination(
            term_path, termination_message(FailureReason.CONFIG_ERROR, None, None, str(err))
        )
        return int(ExitCode.CONFIG_ERROR)

    from .checkpointing import make_checkpointer
    from .cluster.ray_bootstrap import init_ray
    from .driver.driver import GRPOTrainer
    from .liveness.attempt_events import keep_attempt_events
    from .liveness.attempt_keeper import keeper_for
    from .liveness.kube_progress import reporter_for

    reporter = reporter_for(cfg)
    # The earlier attempts' pods are gone and their events expire within the hour.
    keep_attempt_events(cfg, range(cfg.trainer.attempt))
    files = AttemptFiles.of(cfg)  # the worker pods' preStop hooks wait on these
    if files is not None:
        files.clear()
    keeper = keeper_for(cfg)  # no claim: this pod's attempts/ copied to the store
    if keeper is not None:
        keeper.start()
    trainer: GRPOTrainer | None = None
    started_ray = False
    try:
        trainer = GRPOTrainer(
            cfg, reporter=reporter, checkpointer=make_checkpointer(cfg, resume=resume)
        )
        started_ray = init_ray(cfg)
        trainer.run()
        exported = trainer.export_final()
        if term_path.exists() or str(term_path) != TERMINATION_LOG:
            # In a pod (the kubelet made the file) or where asked: the operator reads
            # status.export from it. A local run has no one to tell.
            write_termination(term_path, termination_message(
                FailureReason.SUCCEEDED, trainer.step, trainer.checkpointer.latest_step(),
                f"exported step {exported.step} to {exported.path}" if exported else "",
                export=exported.to_message() if exported else None))
        return int(ExitCode.FINISHED)
    except (Exception, KeyboardInterrupt) as err:
        c = classify(err)
        step = step_of(err)
        last = trainer.checkpointer.latest_step() if trainer is not None else None
        log.error("training failed at step %s (%s, exit %d): %s", step, c.reason, c.code, c.detail)
        if c.code == ExitCode.CONFIG_ERROR:
            print(f"config error: {err}", file=sys.stderr)
        write_termination(term_path, termination_message(c.reason, step, last, c.detail, c.stage))
        return int(c.code)
    finally:
        if trainer is not None:
            trainer.close()
        if files is not None:  # the ranks are needed no more: the hooks let Ray stop
            files.write_done()
        if started_ray:
            import ray

            ray.shutdown()
        # Last: the ranks' pods need not wait on these API calls. Its own events (the next
        # attempt adds the rest) and the earlier attempts' late ones.
        keep_attempt_events(cfg, range(cfg.trainer.attempt + 1))
        if keeper is not None:  # after the last line and the events
            keeper.close()
