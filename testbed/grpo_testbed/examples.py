"""The repository's example GRPOJobs, loaded and varied for tests and benchmarks.

One loader for every tier, so a change to an example reaches all of them the same way.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = "grpojob-tiny.yaml"


def example_job(example: str = TINY, name: str | None = None, *, kwok: bool = True,
                **spec_changes: Any) -> dict[str, Any]:
    """An example manifest, renamed, with ``a__b=value`` spec changes applied.

    ``kwok``: the pods will run in name only on kwok nodes, so the tiny example's
    model claim (its weights and data, which only the local node reads) is dropped;
    otherwise the scheduler would wait for a claim that kwok tests never create.
    """
    doc: dict[str, Any] = yaml.safe_load((EXAMPLES / example).read_text())
    if name is not None:
        doc["metadata"] = {"name": name}
    if kwok:
        doc["spec"]["model"].pop("claimName", None)
    for dotted, value in spec_changes.items():
        node = doc["spec"]
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = copy.deepcopy(value)
    return doc


def broken_job(case: dict[str, Any]) -> dict[str, Any]:
    """The tiny example broken as one case of tests/cluster/broken_grpojobs.yaml says."""
    doc = example_job(TINY, f"broken-{case['name']}", kwok=False)
    spec = doc["spec"]
    if "delete" in case:
        *parents, leaf = case["delete"].split(".")
        node = spec
        for p in parents:
            node = node[p]
        del node[leaf]
    for section, values in case.get("set", {}).items():
        spec[section] = {**spec.get(section, {}), **copy.deepcopy(values)}
    return doc
