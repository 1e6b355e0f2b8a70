"""The Helm chart rendered by the pinned helm (`helm template`, no cluster): what the
chart's unit tests read."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from .versions import binary

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts/grpo-operator"
KUBE_VERSION = "1.36.3"  # the testbed's; helm template otherwise assumes an old default
NS = "grpo-system"
# Full image references (the names `make images` gives them) for renders that are not
# about images: the chart refuses to render while an image names no registry host
# (values.yaml, global.imageRegistry), and its defaults name none.
IMAGES: dict[str, str] = {
    "image.repository": "localhost/grpo-operator/operator",
    "trainerImage": "localhost/grpo-operator/trainer:0.1.0",
}


class HelmMissing(RuntimeError):
    pass


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    exe = binary("helm")
    if not exe.exists():
        raise HelmMissing(f"helm is not built at {exe}: run `make setup` (builds the "
                          "testbed binaries, helm among them)")
    proc = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60,
                          check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def set_args(values: dict[str, str], images: bool = True) -> list[str]:
    """--set arguments for these values; `images`: IMAGES first, which these override
    (False: the chart's own image defaults)."""
    merged = {**IMAGES, **values} if images else values
    return [a for k, v in merged.items() for a in ("--set", f"{k}={v}")]


def template(values: dict[str, str], check: bool = True,
             images: bool = True) -> subprocess.CompletedProcess[str]:
    """`helm template` of release `grpo` in NS with these --set values (over IMAGES
    unless `images` is False)."""
    return helm("template", "grpo", str(CHART), "-n", NS, "--kube-version", KUBE_VERSION,
                *set_args(values, images), check=check)


@functools.cache
def _render(values: tuple[tuple[str, str], ...], images: bool) -> str:
    return template(dict(values), images=images).stdout


def render(values: dict[str, str] | None = None,
           images: bool = True) -> list[dict[str, Any]]:
    """The chart's objects for these --set values, over IMAGES unless `images` is False
    (fresh dicts; the text is cached)."""
    return [d for d in yaml.safe_load_all(
        _render(tuple(sorted((values or {}).items())), images)) if d]


def objects(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = objects(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]
