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


def set_args(values: dict[str, str]) -> list[str]:
    return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]


def template(values: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """`helm template` of release `grpo` in NS with these --set values."""
    return helm("template", "grpo", str(CHART), "-n", NS, "--kube-version", KUBE_VERSION,
                *set_args(values), check=check)


@functools.cache
def _render(values: tuple[tuple[str, str], ...]) -> str:
    return template(dict(values)).stdout


def render(values: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """The chart's objects for these --set values (fresh dicts; the text is cached)."""
    return [d for d in yaml.safe_load_all(_render(tuple(sorted((values or {}).items())))) if d]


def objects(docs: Iterable[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: Iterable[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = objects(docs, kind)
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]
