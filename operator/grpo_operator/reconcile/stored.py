"""The job's status as the API server stores it, read once per decision into the API's
typed model (grpo_api.job.status.GRPOJobStatus), and typed values written back in the
stored (wire) form (pure).

A status written by an older (or newer) operator must still read, and lose nothing when
this one writes: fields it did not write take the model's defaults; fields this version
does not know (one it removed, a newer one's) are kept beside the model's fields, read
with `extra="allow"` (the API models forbid them to admit a spec, but a status is read,
not admitted), and `wire` writes them back with the object that holds them, so an
attempts[] rewritten after an attempt ends keeps every record's unknown fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from pydantic import BaseModel, ValidationError

from grpo_api.job.status import GRPOJobStatus, ProgressStatus


@dataclass(frozen=True)
class StoredStatus:
    """The status a decision is made from: typed, and as stored (what a merge patch is
    compared with, so that only a change is written)."""

    status: GRPOJobStatus = field(default_factory=lambda: GRPOJobStatus.model_validate({}))
    stored: Mapping[str, Any] = field(default_factory=dict)
    # Why some stored fields did not read (they are left out of `status`, and left as they
    # are in storage: a decision on such a status writes none of them); None: all read.
    unreadable: ValidationError | None = None

    def unread(self, field_name: str) -> bool:
        """Whether the stored status holds this GRPOJobStatus field but it did not read."""
        return self.unreadable is not None and any(
            e["loc"][:1] == (wire_name(field_name),) for e in self.unreadable.errors())


def read_status(stored: object) -> StoredStatus:
    """`stored` (the job's .status) read as the model, tolerating what the code before it
    tolerated: absent and null fields (a merge patch's null removes a field: it reads as
    absent) and numbers written as strings ("3"); unknown fields are kept. A field that
    still does not read is left out, and named in `unreadable`."""
    raw = dict(stored) if isinstance(stored, Mapping) else {}
    present = {k: v for k, v in raw.items() if v is not None}
    try:
        return StoredStatus(_validated(present), raw)
    except ValidationError as exc:
        bad = {e["loc"][0] for e in exc.errors() if e["loc"]}
        readable = {k: v for k, v in present.items() if k not in bad}
        return StoredStatus(_validated(readable), raw, exc)


def _validated(fields: dict[str, Any]) -> GRPOJobStatus:
    return GRPOJobStatus.model_validate(fields, strict=False, extra="allow")


def wire(value: Any) -> Any:
    """`value` in the stored form: a model as its fields that were read or set, by their
    wire names (a field set to None is written as null: a merge patch removes it), then
    the fields it did not know, as they were read; enums as their values."""
    if isinstance(value, BaseModel):
        known = type(value).model_fields
        out = {(info.alias or name): wire(getattr(value, name))
               for name, info in known.items() if name in value.model_fields_set}
        return out | {k: wire(v) for k, v in (value.model_extra or {}).items()}
    if isinstance(value, list | tuple):
        return [wire(v) for v in value]
    if isinstance(value, dict):
        return {k: wire(v) for k, v in value.items()}
    if isinstance(value, Enum):
        return value.value
    return value


def wire_name(field_name: str) -> str:
    """The stored name of a GRPOJobStatus field."""
    return GRPOJobStatus.model_fields[field_name].alias or field_name


def reported_step(progress: ProgressStatus | None) -> int | None:
    """The last step the trainer reported; None before its first report (the model's
    default 0 is not a report)."""
    if progress is None or "step" not in progress.model_fields_set:
        return None
    return progress.step
