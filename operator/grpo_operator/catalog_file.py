"""The effective GPU catalog: the built-in one merged with the chart's `gpuCatalog` value.

The chart writes `gpuCatalog` into a ConfigMap mounted in the operator's pod and passes
its path in $GRPO_GPU_CATALOG (`grpo-operator --gpu-catalog`). `merge_catalog` is pure;
`load_catalog` reads the file. A bad file stops the operator at start with the entry and
field named, rather than planning jobs on a half-read catalog.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpo_api.catalog import CPU_GPU_TYPE, GPU_CATALOG, GPU_NAME_PATTERN, GpuType

# A new type must say at least this much for the planner to size it (chart values.yaml).
REQUIRED_FOR_NEW = ("memoryGiB", "productLabel", "hostMemoryGiB", "cpus", "gpusPerNode")


class CatalogError(ValueError):
    """The gpuCatalog overrides are invalid; the message names the entry and field."""


class CatalogEntry(BaseModel):
    """One `gpuCatalog` entry as the chart's values.schema.json describes it."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=False)

    memory_gib: float | None = Field(None, gt=0, alias="memoryGiB")
    product_label: str | None = Field(None, min_length=1, alias="productLabel")
    host_memory_gib: float | None = Field(None, gt=0, alias="hostMemoryGiB")
    cpus: int | None = Field(None, ge=1)
    gpus_per_node: int | None = Field(None, ge=0, alias="gpusPerNode")
    interconnect: str | None = None
    intra_node_gbps: float | None = Field(None, ge=0, alias="intraNodeGBps")
    inter_node_gbps: float | None = Field(None, ge=0, alias="interNodeGBps")
    bf16_tflops: float | None = Field(None, ge=0, alias="bf16Tflops")
    # The RDMA fabric between this type's nodes; "none" clears a built-in one.
    fabric: Literal["infiniband", "efa", "none"] | None = None  # grpo_api.catalog.FABRICS


def _entry(name: str, raw: Any) -> CatalogEntry:
    if not isinstance(name, str) or not re.match(GPU_NAME_PATTERN, name):
        raise CatalogError(f"gpuCatalog: {name!r} is not a GPU type name ({GPU_NAME_PATTERN})")
    if name == CPU_GPU_TYPE:
        raise CatalogError("gpuCatalog.cpu: the cpu pseudo-type cannot be overridden")
    try:
        return CatalogEntry.model_validate(raw if raw is not None else {})
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        where = f"gpuCatalog.{name}" + (f".{field}" if field else "")
        raise CatalogError(f"{where}: {err['msg']}") from None


def merge_catalog(
    overrides: Mapping[str, Any], base: Mapping[str, GpuType] = GPU_CATALOG
) -> dict[str, GpuType]:
    """`base` with each override applied: fields of a known type replaced, a new name
    added (it must set every field in REQUIRED_FOR_NEW)."""
    out = dict(base)
    for name, raw in overrides.items():
        entry = _entry(name, raw)
        given: dict[str, Any] = entry.model_dump(exclude_none=True)
        if given.get("fabric") == "none":
            given["fabric"] = None  # Ethernet-only nodes: NCCL over TCP is expected
        if {"host_memory_gib", "cpus"} & given.keys():  # the platform's own figures
            given["node_source"] = (f"the chart's gpuCatalog.{name} (Nodes not read; "
                                    "read Nodes take their place)")
        if name in out:
            out[name] = replace(out[name], **given)
            continue
        missing = [a for a in REQUIRED_FOR_NEW if getattr(entry, _field(a)) is None]
        if missing:
            raise CatalogError(
                f"gpuCatalog.{name}: a new GPU type needs {', '.join(missing)} "
                f"(known types it could override instead: {', '.join(base)})"
            )
        out[name] = GpuType(
            name=name,
            interconnect=entry.interconnect or "unknown",
            intra_node_gbps=entry.intra_node_gbps or 0.0,
            inter_node_gbps=entry.inter_node_gbps or 0.0,
            bf16_tflops=entry.bf16_tflops or 0.0,
            fabric=given.get("fabric"),
            node_source=given["node_source"],
            **{k: given[k] for k in map(_field, REQUIRED_FOR_NEW)},
        )
    return out


def _field(alias: str) -> str:
    return next(n for n, f in CatalogEntry.model_fields.items() if (f.alias or n) == alias)


def load_catalog(path: str | Path | None) -> dict[str, GpuType]:
    """The effective catalog: built-in, merged with the YAML mapping at `path` if any."""
    if not path:
        return dict(GPU_CATALOG)
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise CatalogError(f"GPU catalog {path}: {exc}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise CatalogError(f"GPU catalog {path}: expected a mapping of GPU type -> fields")
    return merge_catalog(raw)
