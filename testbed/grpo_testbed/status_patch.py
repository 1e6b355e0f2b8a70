"""The API server's rules for a GRPOJob status write, for tests that run without one.

A status patch that unit tests accept must be one the real API server accepts: it merges
a merge patch by RFC 7386 (an explicit null removes the key; objects merge key by key;
lists are replaced whole) and then validates the merged object against the CRD's
openAPIV3Schema (types, enums, patterns, bounds, formats). `apply_status_patch` does
both, with the schema generated from the same models as `crds/grpojob.yaml`, so a
condition type, reason or field the CRD does not know fails here as it would there.
"""

from __future__ import annotations

import copy
import datetime as dt
from functools import cache
from typing import Any

import jsonschema

from grpo_operator.crd import open_api_schema


class Rejected(AssertionError):
    """What the API server would answer with 422 Invalid."""


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the API server applies `--type=merge`."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


def _date_time(value: object) -> bool:
    if not isinstance(value, str):
        return True  # the type check reports it
    try:
        dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return False
    return "T" in value


@cache
def _status_validator() -> jsonschema.Draft4Validator:
    checker = jsonschema.FormatChecker(formats=())
    checker.checks("date-time")(_date_time)
    return jsonschema.Draft4Validator(open_api_schema()["properties"]["status"],
                                      format_checker=checker)


def status_problems(status: dict[str, Any]) -> list[str]:
    """Why the API server would refuse a GRPOJob whose status is `status` ([] if not)."""
    return [f"status.{'.'.join(str(p) for p in e.absolute_path)}: {e.message}"
            for e in _status_validator().iter_errors(status)]


def apply_status_patch(status: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """The status after the API server merged `patch` (a body's `status`); raises
    Rejected, naming each field, when the merged status violates the CRD's schema."""
    merged = merge_patch(status, patch)
    problems = status_problems(merged)
    if problems:
        raise Rejected("the API server would refuse this status patch:\n  "
                       + "\n  ".join(problems) + f"\npatch: {patch}")
    return dict(merged)
