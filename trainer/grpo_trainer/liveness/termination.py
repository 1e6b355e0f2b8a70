"""The termination message: the JSON the operator reads from the driver's
termination log (its reason, step, last checkpoint and the failure's words), written when
the driver ends, or by the stall monitor when it ends a hung run itself."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from grpo_api.contract import (
    TERMINATION_LOG,
    TERMINATION_MESSAGE_MAX_BYTES,
    FailureReason,
    RankStage,
)

log = logging.getLogger(__name__)


def termination_log_path(configured: str | None = None) -> Path:
    return Path(configured or os.environ.get("GRPO_TERMINATION_LOG") or TERMINATION_LOG)


def termination_message(
    reason: FailureReason, step: int | None, last_checkpoint_step: int | None, detail: str,
    stage: RankStage | None = None, export: dict[str, object] | None = None,
) -> str:
    """The JSON the operator reads, trimmed so it always fits the 4 KiB limit; a
    succeeded run's `export` ({path, step}) becomes the job's status.export."""
    body: dict[str, object] = {
        "reason": str(reason),
        "step": step,
        "lastCheckpointStep": last_checkpoint_step,
        "detail": detail,
    }
    if stage is not None:
        body["stage"] = stage.value
    if export is not None:
        body["export"] = export
    text = json.dumps(body)
    while len(text.encode()) > TERMINATION_MESSAGE_MAX_BYTES:
        # Keep the tail: the innermost error line is the informative part.
        cut = len(text.encode()) - TERMINATION_MESSAGE_MAX_BYTES + 16
        body["detail"] = "..." + str(body["detail"])[cut:]
        text = json.dumps(body)
    return text


def write_termination(path: Path, message: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "w") as f:
            f.write(message)
    except OSError as err:  # never mask the real failure with a logging failure
        log.error("could not write termination message to %s: %s", path, err)
