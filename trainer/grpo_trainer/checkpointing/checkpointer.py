"""The checkpointer protocol the driver calls; ``checkpointing.dcp.DCPCheckpointer`` is one.

What a checkpoint must hold (docs/incidents.md) and where each piece comes from:
model + optimizer + LR scheduler (each rank's ``RankState`` holds ``actor``/``optimizer``/
``scheduler``, all rank-local FSDP2 state), the step, the data-loader position
(``StatefulLoader.state_dict``), every rank's RNG streams (rollouts are already a
pure function of ``rollout.seed``, step and rank, see ``rollout.seeds.rollout_seed``).
``make_checkpointer`` (this package) picks the implementation from the config.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..rank_api import RankGroup


class Checkpointer(Protocol):
    def latest_step(self) -> int | None:
        """Newest complete checkpoint's step, or None (used in termination messages)."""
        ...

    def restore(self, group: RankGroup, loader: Any) -> int:
        """Load the newest complete checkpoint into workers and loader; its step, 0 if none."""
        ...

    def maybe_save(self, step: int, group: RankGroup, loader: Any, *, final: bool) -> None:
        """Save when ``step`` hits the interval (or ``final``)."""
        ...

    def save_now(self, step: int, group: RankGroup, loader: Any) -> bool:
        """Commit the save in flight, then save ``step`` unless it is committed already
        (or is 0); whether this call saved."""
        ...

    def save_seconds(self) -> float | None:
        """The newest committed save's measured time, start to commit."""
        ...

    def upload_status(self) -> dict[str, object] | None:
        """With checkpoint.store: the newest save's upload as status.progress
        .checkpointUpload has it (camelCase); None without a store or before a save."""
        ...


class NoCheckpointer:
    """Training without checkpoints: nothing is written anywhere."""

    def latest_step(self) -> int | None:
        return None

    def restore(self, group: RankGroup, loader: Any) -> int:
        return 0

    def maybe_save(self, step: int, group: RankGroup, loader: Any, *, final: bool) -> None:
        return None

    def save_now(self, step: int, group: RankGroup, loader: Any) -> bool:
        return False

    def save_seconds(self) -> float | None:
        return None

    def upload_status(self) -> dict[str, object] | None:
        return None
