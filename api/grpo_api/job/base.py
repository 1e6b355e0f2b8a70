"""Shared pydantic base: camelCase on the wire, snake_case in Python, unknown fields rejected."""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"  # DNS-1123 label (PVC, volume, Secret)
SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"  # an object name (PriorityClass, ...)

# Kubernetes resource.Quantity, the subset people write for memory and storage sizes.
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
_QUANTITY_RE = re.compile(QUANTITY_PATTERN)
_SUFFIX_BYTES: dict[str, float] = {
    "": 1,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "E": 1e18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}


def quantity_bytes(value: str) -> float:
    """Bytes in a Kubernetes quantity such as "760Gi" or "1.5T"."""
    if not _QUANTITY_RE.match(value):  # also checked by the schema; this is for Python callers
        raise ValueError(f"{value!r} is not a size; write e.g. 760Gi or 1Ti")
    match = _QUANTITY_RE.match(value)
    assert match is not None
    suffix = match.group(2) or ""
    return float(value[: len(value) - len(suffix)]) * _SUFFIX_BYTES[suffix]


def quantity_gib(value: str) -> float:
    return quantity_bytes(value) / 2**30


class ApiModel(BaseModel):
    """Base for every API object: the wire format is the CRD's (camelCase, strict)."""

    model_config = ConfigDict(
        extra="forbid",
        strict=True,  # like the API server: "true" is not a boolean, "2" is not an integer
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=False,
    )

    def to_wire(self) -> dict[str, object]:
        """The JSON-compatible camelCase form the API server stores."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


def cel_rule(rule: str, message: str, field_path: str | None = None) -> JsonDict:
    """A CEL x-kubernetes-validations rule; fieldPath makes the error name the field."""
    out: JsonDict = {"rule": rule, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    return out
