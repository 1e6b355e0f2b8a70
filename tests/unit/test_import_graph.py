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
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
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


def test_no_new_import_crosses_between_operator_and_trainer() -> None:
    operator = set().union(*imports_of(OPERATOR, "grpo_trainer").values())
    assert operator <= OPERATOR_MAY_IMPORT, imports_of(OPERATOR, "grpo_trainer")
    trainer = set().union(*imports_of(TRAINER, "grpo_operator").values())
    assert trainer <= TRAINER_MAY_IMPORT, imports_of(TRAINER, "grpo_operator")
