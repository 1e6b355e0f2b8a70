"""A script that is not in any package (bench/*.py, examples/*.py) imported as a module
by its path, for tests of the functions it defines."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def load_script(path: Path, name: str | None = None) -> ModuleType:
    """The module ``path`` defines, registered in sys.modules under ``name`` (its file's
    stem by default): dataclasses and pickling look their module up there."""
    name = name or path.stem
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, f"no module at {path}"
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
