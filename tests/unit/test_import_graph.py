"""Which way the packages depend: the operator runs without torch or the trainer's code.

Two checks that fail on a new crossing: every module of grpo_operator imported in a
fresh interpreter (so whatever any of them pulls in is seen), and a static read of every
import statement in both source trees (an import inside a function counts too).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPERATOR = ROOT / "operator" / "grpo_operator"
TRAINER = ROOT / "trainer" / "grpo_trainer"
HEAVY = ("torch", "ray", "vllm", "transformers", "safetensors", "numpy")
# The crossings that remain until the shared contract and config schema move to a
# package of their own (issue 16): the list may only shrink.
OPERATOR_MAY_IMPORT = {"grpo_trainer.config"}
TRAINER_MAY_IMPORT = {"grpo_operator.contract"}

_IMPORT_EVERYTHING = """
import importlib, json, pkgutil, sys
import grpo_operator
names = [m.name for m in pkgutil.walk_packages(grpo_operator.__path__, "grpo_operator.")
         if not m.name.endswith("__main__")]  # __main__ would start the operator
for name in names:
    importlib.import_module(name)
print(json.dumps({"imported": names, "modules": sorted(sys.modules)}))
"""


def imports_of(tree: Path, prefix: str) -> dict[str, set[str]]:
    """Every module named `prefix...` that a file of `tree` imports, by file."""
    found: dict[str, set[str]] = {}
    for path in tree.rglob("*.py"):
        package = list(path.relative_to(tree.parent).parts[:-1])  # __init__.py's too
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                # `from .x import y` and `from . import y`: resolved against the package.
                base = package[:len(package) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                names = [module, *(f"{module}.{a.name}" for a in node.names)]
            else:
                continue
            hits = {n for n in names if n == prefix or n.startswith(prefix + ".")}
            if hits:
                found.setdefault(str(path.relative_to(ROOT)), set()).update(hits)
    return found


def test_every_operator_module_imports_without_torch_or_the_trainer() -> None:
    out = subprocess.run([sys.executable, "-c", _IMPORT_EVERYTHING], capture_output=True,
                         text=True, check=True, timeout=120)
    seen = json.loads(out.stdout.splitlines()[-1])
    assert {"grpo_operator.handlers", "grpo_operator.render.children",
            "grpo_operator.webhook", "grpo_operator.main"} <= set(seen["imported"])
    modules = set(seen["modules"])
    heavy = sorted(m for m in modules if m.split(".")[0] in HEAVY)
    assert not heavy, f"the operator pulled in {heavy[:5]}"
    trainer = {m for m in modules if m.startswith("grpo_trainer.")}
    assert trainer <= OPERATOR_MAY_IMPORT, sorted(trainer - OPERATOR_MAY_IMPORT)


def beyond(found: dict[str, set[str]], allowed: set[str]) -> dict[str, set[str]]:
    """The imports in `found` that are not an allowed module or a name in one."""
    out = {f: {n for n in names if not any(n == a or n.startswith(a + ".") for a in allowed)}
           for f, names in found.items()}
    return {f: names for f, names in out.items() if names}


def test_no_new_import_crosses_between_operator_and_trainer() -> None:
    assert not beyond(imports_of(OPERATOR, "grpo_trainer"), OPERATOR_MAY_IMPORT)
    assert not beyond(imports_of(TRAINER, "grpo_operator"), TRAINER_MAY_IMPORT)


def test_shipped_code_never_imports_the_test_helpers() -> None:
    """grpo_trainer.testing is left out of the images (their .dockerignore): nothing else
    in the package may need it."""
    shipped = {f: m for f, m in imports_of(TRAINER, "grpo_trainer.testing").items()
               if "/testing/" not in f}
    assert not shipped, shipped
    for image in ("trainer", "operator"):
        ignore = (ROOT / "images" / image / "Dockerfile.dockerignore").read_text().split()
        assert "trainer/grpo_trainer/testing/" in ignore, image
