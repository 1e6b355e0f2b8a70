"""Which way the packages depend: grpo_api at the bottom, the operator and the trainer on it.

The proof is static: every import statement of every module (one inside a function or
under TYPE_CHECKING counts too) is read with `ast`, and the imports are followed
transitively through the first-party source, so a crossing two hops away is found as
surely as a direct one. A failure names each hop: file, line and the import statement.

- grpo_api imports neither side, nor the testbed, torch, Kopf or the Kubernetes client;
- grpo_operator never imports grpo_trainer (nor torch and the rest of the GPU stack);
- grpo_trainer never imports grpo_operator (nor Kopf);
- no shipped package imports the testbed, and nothing shipped imports the trainer's
  test helpers (which the images leave out);
- no package has an import circle: a module that needs another's state is handed it
  (the update and the checkpointer get a ``RankState``; Kueue's start gets the control
  plane as a ``kueue.ControlPlane``) instead of importing its owner.

One runtime check stays: importing every operator module in a fresh interpreter, which
also sees what third-party packages pull in.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Package -> its source root (pyproject.toml's [tool.setuptools.packages.find] `where`).
SOURCES = {
    "grpo_api": ROOT / "api",
    "grpo_operator": ROOT / "operator",
    "grpo_trainer": ROOT / "trainer",
    "grpo_testbed": ROOT / "testbed",
    "grpo_testkit": ROOT / "testkit",
}
GPU_STACK = {"torch", "ray", "vllm", "transformers", "safetensors", "numpy", "torchvision"}
# What each shipped package must never reach, directly or through another module.
FORBIDDEN = {
    "grpo_api": {"grpo_operator", "grpo_trainer", "grpo_testbed", "grpo_testkit", "kopf",
                 "kubernetes", *GPU_STACK},
    "grpo_operator": {"grpo_trainer", "grpo_testbed", "grpo_testkit", *GPU_STACK},
    "grpo_trainer": {"grpo_operator", "grpo_testbed", "grpo_testkit", "kopf"},
}
TEST_HELPERS = "grpo_testkit"
# Packages whose modules must not import each other in a circle: all of them.
NO_CIRCLES = tuple(SOURCES)


@dataclass(frozen=True)
class Import:
    """One import statement: who imports, where, and the module it resolves to."""

    importer: str  # dotted module name
    path: Path
    line: int
    statement: str
    target: str  # a first-party module, or a third-party dotted name

    def describe(self, root: Path) -> str:
        try:
            where = self.path.relative_to(root)
        except ValueError:
            where = self.path
        return f"{where}:{self.line}: {self.statement}"


def modules_of(sources: Mapping[str, Path]) -> dict[str, Path]:
    """Every first-party module by dotted name (a package by its __init__.py)."""
    found: dict[str, Path] = {}
    for package, root in sources.items():
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _resolve(name: str, modules: Mapping[str, Path]) -> str:
    """`a.b.c` as imported: the longest prefix that is a first-party module, else as is."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in modules:
            return ".".join(parts[:n])
    return name


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> list[Import]:
    """The modules one file imports, relative imports resolved, in source order."""
    source = path.read_text()
    lines = source.splitlines()
    is_package = path.name == "__init__.py"
    package = module.split(".") if is_package else module.split(".")[:-1]
    out: list[Import] = []
    for node in ast.walk(ast.parse(source, str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            parent = ".".join([*base, *([node.module] if node.module else [])])
            # `from p import x`: x is a submodule of p, or a name defined in p.
            names = [parent, *(f"{parent}.{a.name}" for a in node.names if a.name != "*")]
        else:
            continue
        text = " ".join(line.strip() for line in lines[node.lineno - 1 : node.end_lineno])
        for target in dict.fromkeys(_resolve(n, modules) for n in names):
            out.append(Import(module, path, node.lineno, text, target))
    return out


def _with_parents(module: str, modules: Mapping[str, Path]) -> list[str]:
    """Importing a.b.c runs a/__init__.py and a/b/__init__.py first."""
    parts = module.split(".")
    return [m for n in range(1, len(parts) + 1) if (m := ".".join(parts[:n])) in modules]


def violations(package: str, forbidden: set[str],
               sources: Mapping[str, Path] = SOURCES) -> list[str]:
    """Every forbidden top-level package `package` reaches, each with its chain of imports."""
    modules = modules_of(sources)
    # Breadth first from every module of the package: the chain found is a shortest one.
    came_from: dict[str, Import | None] = {m: None for m in modules
                                           if m.split(".")[0] == package}
    queue = deque(came_from)
    found: list[str] = []
    reported: set[tuple[Path, int]] = set()  # one report per statement
    while queue:
        module = queue.popleft()
        for imp in imports_of(module, modules[module], modules):
            top = imp.target.split(".")[0]
            if top in forbidden:
                if (imp.path, imp.line) in reported:
                    continue
                reported.add((imp.path, imp.line))
                chain = [imp]
                while (prev := came_from[chain[-1].importer]) is not None:
                    chain.append(prev)
                hops = "\n    ".join(i.describe(ROOT) for i in reversed(chain))
                found.append(f"{package} reaches {imp.target}:\n    {hops}")
                continue
            for target in _with_parents(imp.target, modules):
                if target not in came_from:
                    came_from[target] = imp
                    queue.append(target)
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_package_reaches_what_it_must_not(package: str) -> None:
    found = violations(package, FORBIDDEN[package])
    assert not found, "\n".join(found)


def test_shipped_code_never_imports_the_test_helpers() -> None:
    """grpo_testkit stays out of the images (test_image_context.py): nothing
    shipped may need it."""
    modules = modules_of(SOURCES)
    shipped = {m: p for m, p in modules.items()
               if m.split(".")[0] in FORBIDDEN and not m.startswith(TEST_HELPERS)}
    found = [imp.describe(ROOT) for m, p in shipped.items() for imp in imports_of(m, p, modules)
             if imp.target == TEST_HELPERS or imp.target.startswith(TEST_HELPERS + ".")]
    assert not found, "\n".join(found)


def _internal_edges(package: str, sources: Mapping[str, Path]) -> dict[str, dict[str, Import]]:
    """module -> {module of the same package it makes Python import: the statement}."""
    modules = modules_of(sources)
    ours = {m: p for m, p in modules.items() if m.split(".")[0] == package}
    edges: dict[str, dict[str, Import]] = {}
    for module, path in ours.items():
        out = edges.setdefault(module, {})
        for imp in imports_of(module, path, modules):
            for target in _with_parents(imp.target, modules):
                # A module's own packages are already being imported when it imports a
                # sibling (`from .files import x` in a/b.py does not run a/__init__.py again).
                if target in ours and target != module and not module.startswith(target + "."):
                    out.setdefault(target, imp)
    return edges


def import_circles(package: str, sources: Mapping[str, Path] = SOURCES) -> list[str]:
    """Each import circle among `package`'s modules, as its hops (file, line, statement);
    a shortest one through each module not already named in a reported circle."""
    edges = _internal_edges(package, sources)
    found: list[str] = []
    named: set[str] = set()
    for start in sorted(edges):
        if start in named:
            continue
        came_from: dict[str, Import | None] = {start: None}
        queue = deque([start])
        circle: list[Import] = []
        while queue and not circle:
            module = queue.popleft()
            for target, imp in sorted(edges[module].items()):
                if target == start:
                    circle = [imp]
                    while (prev := came_from[circle[-1].importer]) is not None:
                        circle.append(prev)
                    break
                if target not in came_from:
                    came_from[target] = imp
                    queue.append(target)
        if circle:
            hops = list(reversed(circle))
            named.update(i.importer for i in hops)
            ring = " -> ".join([*(i.importer for i in hops), start])
            found.append(f"{ring}:\n    " + "\n    ".join(i.describe(ROOT) for i in hops))
    return found


@pytest.mark.parametrize("package", NO_CIRCLES)
def test_no_import_circle(package: str) -> None:
    """Every import counts (lazy, TYPE_CHECKING): a circle means two modules are one job
    split across files, which is how PolicyUpdate came to read its Worker's attributes."""
    found = import_circles(package)
    assert not found, "\n".join(found)


def folder_circles(package: str, sources: Mapping[str, Path] = SOURCES) -> list[str]:
    """Each circle among the rooms of a folder, at every level: in each package folder, its
    subfolders and its own modules are the rooms; a module's import of another module of
    the same folder is an arrow between the rooms that hold them. One circle per folder, as
    the statements that make its arrows."""
    edges = _internal_edges(package, sources)
    folders = {m for m, p in modules_of(sources).items()
               if m.split(".")[0] == package and p.name == "__init__.py"}
    found: list[str] = []
    for folder in sorted(folders):
        depth = folder.count(".") + 1
        arrows: dict[str, dict[str, Import]] = {}
        for module, targets in edges.items():
            for target, imp in targets.items():
                if not (module.startswith(folder + ".") and target.startswith(folder + ".")):
                    continue  # the folder's own __init__, or outside it
                a, b = module.split(".")[depth], target.split(".")[depth]
                if a != b:
                    arrows.setdefault(a, {}).setdefault(b, imp)
        ring = _a_circle(arrows)
        if ring:
            hops = [arrows[x][y] for x, y in pairwise(ring)]
            found.append(f"{folder}: {' -> '.join(ring)}:\n    "
                         + "\n    ".join(i.describe(ROOT) for i in hops))
    return found


def _a_circle(arrows: Mapping[str, Mapping[str, object]]) -> list[str]:
    """One circle of the graph as its rooms, the first repeated at the end ([]: none)."""
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(room: str) -> list[str]:
        state[room] = 1
        path.append(room)
        for nxt in sorted(arrows.get(room, {})):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (ring := visit(nxt)):
                return ring
        path.pop()
        state[room] = 2
        return []

    for room in sorted(arrows):
        if room not in state and (ring := visit(room)):
            return ring
    return []


@pytest.mark.parametrize("package", NO_CIRCLES)
def test_no_circle_between_the_rooms_of_any_folder(package: str) -> None:
    """A folder's subfolders and modules depend one way: the trainer's root holds its
    entry points and the few facts every room reads, and the rooms (driver, rank, rollout,
    model, algorithm, cluster, checkpointing...) form no circle; so do the rooms inside
    each of them."""
    found = folder_circles(package)
    assert not found, "\n".join(found)


# ---- the checker can fail: a planted crossing, two hops deep -------------------------


def _plant(root: Path, files: Mapping[str, str]) -> dict[str, Path]:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return {p: root / p.split("_")[1] for p in ("grpo_api", "grpo_operator", "grpo_trainer")}


def test_a_transitive_crossing_is_reported_with_every_hop(tmp_path: Path) -> None:
    sources = _plant(tmp_path, {
        "api/grpo_api/__init__.py": "",
        "api/grpo_api/shapes.py": "def f() -> None:\n    import torch  # lazily\n",
        "operator/grpo_operator/__init__.py": "",
        "operator/grpo_operator/render/__init__.py": "from .config import x\n",
        "operator/grpo_operator/render/config.py": "from grpo_trainer.loading import (\n"
                                                   "    x,\n)\n",
        "trainer/grpo_trainer/__init__.py": "",
        "trainer/grpo_trainer/loading.py": "from grpo_api import shapes\nx = 1\n",
    })
    operator = violations("grpo_operator", FORBIDDEN["grpo_operator"], sources)
    assert len(operator) == 1, operator
    assert "grpo_operator reaches grpo_trainer.loading" in operator[0]
    assert "operator/grpo_operator/render/config.py:1: from grpo_trainer.loading import " \
        "( x, )" in operator[0]
    api = violations("grpo_api", FORBIDDEN["grpo_api"], sources)
    assert len(api) == 1 and "api/grpo_api/shapes.py:2: import torch" in api[0], api
    # The trainer reaches torch only through grpo_api, which is allowed for it; and
    # importing grpo_api.shapes runs grpo_api/__init__.py, which is followed too.
    assert violations("grpo_trainer", FORBIDDEN["grpo_trainer"], sources) == []


def test_a_circle_through_a_lazy_import_is_reported_and_siblings_are_not(
    tmp_path: Path,
) -> None:
    sources = _plant(tmp_path, {
        "trainer/grpo_trainer/__init__.py": "",
        "trainer/grpo_trainer/worker.py": "from .update import Update\n",
        "trainer/grpo_trainer/update.py": "from typing import TYPE_CHECKING\n"
                                          "if TYPE_CHECKING:\n"
                                          "    from .worker import Worker\n",
        # A package that re-exports its submodules, which import each other: no circle.
        "trainer/grpo_trainer/ckpt/__init__.py": "from .rank import save\n",
        "trainer/grpo_trainer/ckpt/files.py": "def write() -> None: ...\n",
        "trainer/grpo_trainer/ckpt/rank.py": "from .files import write\nsave = write\n",
        "trainer/grpo_trainer/ckpt/dcp.py": "def f() -> None:\n"
                                            "    from ..seeds import seed\n",
        "trainer/grpo_trainer/seeds.py": "def g() -> None:\n"
                                         "    from .ckpt.dcp import f\n",
    })
    found = import_circles("grpo_trainer", sources)
    assert len(found) == 2, found
    lazy, typed = found
    assert lazy.startswith("grpo_trainer.ckpt.dcp -> grpo_trainer.seeds -> grpo_trainer.ckpt.dcp")
    assert "trainer/grpo_trainer/ckpt/dcp.py:2: from ..seeds import seed" in lazy
    assert "trainer/grpo_trainer/seeds.py:2: from .ckpt.dcp import f" in lazy
    assert typed.startswith("grpo_trainer.update -> grpo_trainer.worker -> grpo_trainer.update")
    assert "trainer/grpo_trainer/update.py:3: from .worker import Worker" in typed
    assert "trainer/grpo_trainer/worker.py:1: from .update import Update" in typed


# ---- runtime: what third-party packages pull in --------------------------------------

_IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
import grpo_api, grpo_operator
names = [m.name for p in (grpo_api, grpo_operator)
         for m in pkgutil.walk_packages(p.__path__, p.__name__ + ".")
         if not m.name.endswith("__main__")]  # __main__ would start the operator
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "modules": sorted(sys.modules)}))
"""


def test_every_operator_module_imports_without_torch_or_the_trainer() -> None:
    out = subprocess.run([sys.executable, "-c", _IMPORT_EVERYTHING], capture_output=True,
                         text=True, check=True, timeout=120)
    seen = json.loads(out.stdout.splitlines()[-1])
    assert {"grpo_operator.handlers", "grpo_operator.render.children", "grpo_api.job",
            "grpo_api.trainer_config", "grpo_operator.main"} <= set(seen["imported"])
    pulled = sorted(m for m in seen["modules"]
                    if m.split(".")[0] in FORBIDDEN["grpo_operator"])
    assert not pulled, f"the operator pulled in {pulled[:5]}"


def test_rooms_that_import_each_other_through_any_module_are_a_circle(tmp_path: Path) -> None:
    sources = _plant(tmp_path, {
        "trainer/grpo_trainer/__init__.py": "",
        "trainer/grpo_trainer/errors.py": "from .ckpt.compat import Incompatible\n",
        "trainer/grpo_trainer/ckpt/__init__.py": "",
        "trainer/grpo_trainer/ckpt/compat.py": "class Incompatible(Exception): ...\n",
        "trainer/grpo_trainer/ckpt/rank.py": "def f() -> None:\n"
                                             "    from ..cluster.placement import g\n",
        "trainer/grpo_trainer/cluster/__init__.py": "",
        "trainer/grpo_trainer/cluster/placement.py": "from ..errors import x\n",
        "trainer/grpo_trainer/cluster/a.py": "from .b import y\n",
        "trainer/grpo_trainer/cluster/b.py": "",
    })
    found = folder_circles("grpo_trainer", sources)
    assert len(found) == 1, found
    assert found[0].startswith("grpo_trainer: ckpt -> cluster -> errors -> ckpt:"), found[0]
    assert "trainer/grpo_trainer/ckpt/rank.py:2: from ..cluster.placement import g" in found[0]
    assert "trainer/grpo_trainer/errors.py:1: from .ckpt.compat import Incompatible" in found[0]

