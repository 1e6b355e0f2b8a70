"""Record every `reconcile()` call of a test run, and replay the record on other code.

A refactoring of the reconcile core must not change what a user sees: record the calls
(inputs and the Action each returned) while the unit and cluster tests run on the code
before the change, then replay the inputs on the code after it and count the Actions
that differ (the status patch, children, deletes, events, retry, metrics; not the
steps' facts, which are the core's own business).

    python -m grpo_testbed.reconcile_replay hook DIR      # writes DIR/sitecustomize.py
    GRPO_RECORD_RECONCILE=REC PYTHONPATH=DIR pytest ...  # every process appends to REC/
    python -m grpo_testbed.reconcile_replay replay REC    # on the other code

The hook wraps `grpo_operator.reconcile.reconcile` as the package is imported, in the
test process and in the operator processes the cluster tier starts (they inherit the
environment). The record is JSON: dataclasses by type name, so a type that moves to
another module still replays. This module imports only the standard library at import
time: the hook loads it by path into any interpreter.
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import types
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pydantic

RECORD_ENV = "GRPO_RECORD_RECONCILE"
PACKAGE = "grpo_operator.reconcile"
# What an Action does, as a user or the cluster sees it (Action.facts is not compared).
COMPARED = ("status", "children", "delete_ray_cluster", "claim_change", "delete_pod",
            "events", "retry", "restart_reason", "recovered_after")


def encode(value: Any) -> Any:
    """`value` as JSON: a dataclass as {"__type__": its class name, fields...}."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {"__type__": type(value).__name__,
                **{f.name: encode(getattr(value, f.name)) for f in dataclasses.fields(value)}}
    if isinstance(value, pydantic.BaseModel):  # the flags' parsed JSON (JobDefaults)
        return {"__model__": type(value).__name__, **value.model_dump(mode="json",
                                                                       by_alias=True)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): encode(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    return value


def _input_types() -> dict[str, type]:
    """The classes a reconcile() call's inputs are made of, by name."""
    from grpo_api.catalog import GpuType
    from grpo_operator import reconcile as rec
    from grpo_operator.config import OperatorConfig, WebhookConfig
    from grpo_operator.job_defaults import JobDefaults
    from grpo_operator.node_shapes import NodeShape

    found: dict[str, type] = {"GpuType": GpuType, "OperatorConfig": OperatorConfig,
                              "WebhookConfig": WebhookConfig, "JobDefaults": JobDefaults,
                              "NodeShape": NodeShape}
    for name in ("Observed", "HubAnswer", "SpecChanged", "BackoffTimer", "ProgressTimer",
                 "JobChanged", "PodChanged", "ClusterChanged", "CreateFailed"):
        found[name] = getattr(rec, name)
    return found


def decode(value: Any, known: Mapping[str, type]) -> Any:
    if isinstance(value, dict) and "__model__" in value:
        model: Any = known[value["__model__"]]
        return model.model_validate({k: v for k, v in value.items() if k != "__model__"})
    if isinstance(value, dict):
        fields = {k: decode(v, known) for k, v in value.items() if k != "__type__"}
        if "__type__" in value:
            cls = known[value["__type__"]]
            names = {f.name for f in dataclasses.fields(cls)}
            if "catalog" in fields:  # OperatorConfig's read-only mapping
                fields["catalog"] = types.MappingProxyType(fields["catalog"])
            return cls(**{k: v for k, v in fields.items() if k in names})
        return fields
    if isinstance(value, list):
        return [decode(v, known) for v in value]
    return value


def action_record(action: Any) -> dict[str, Any]:
    """What the Action does, for comparison."""
    return {k: encode(getattr(action, k, None)) for k in COMPARED}


# ---- recording ----------------------------------------------------------------------


def _recorder(reconcile: Callable[..., Any], out: Path) -> Callable[..., Any]:
    def recorded(job: Any, observed: Any, event: Any, now: str, config: Any) -> Any:
        inputs = encode({"job": job, "observed": observed, "event": event, "now": now,
                         "config": config})  # before the call: nothing may change them
        action = reconcile(job, observed, event, now, config)
        line = {"test": os.environ.get("PYTEST_CURRENT_TEST", f"pid {os.getpid()}"),
                "in": inputs, "out": action_record(action)}
        with out.open("a") as f:
            f.write(json.dumps(line) + "\n")  # in order: a catalog lists its types so
        return action

    return recorded


def install_recorder(package: types.ModuleType, directory: Path) -> None:
    """Wrap the package's `reconcile` (what the handlers and tests call) and core's."""
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"{os.getpid()}.jsonl"
    wrapped = _recorder(package.reconcile, out)
    package.reconcile = wrapped  # type: ignore[attr-defined]
    core = sys.modules.get(f"{package.__name__}.core")
    if core is not None:
        core.reconcile = wrapped  # type: ignore[attr-defined]


class _RecordOnImport(importlib.abc.MetaPathFinder):
    """Installs the recorder once the reconcile package has been executed."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        if name != PACKAGE:
            return None
        sys.meta_path.remove(self)  # once, and not for the lookup below
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        loader, directory = spec.loader, self.directory
        execute = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            execute(module)
            install_recorder(module, directory)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def hook() -> None:
    """Called from the generated sitecustomize.py: record when RECORD_ENV is set."""
    directory = os.environ.get(RECORD_ENV)
    if directory:
        sys.meta_path.insert(0, _RecordOnImport(Path(directory)))


def write_hook(directory: Path) -> Path:
    """DIR/sitecustomize.py, with a copy of this module beside it (the record must not
    depend on the checkout it is replayed in)."""
    directory.mkdir(parents=True, exist_ok=True)
    copy = directory / "reconcile_recorder.py"
    copy.write_text(Path(__file__).read_text())
    site = directory / "sitecustomize.py"
    site.write_text(
        "import importlib.util, sys\n"
        f"_spec = importlib.util.spec_from_file_location('_reconcile_replay', {str(copy)!r})\n"
        "_mod = importlib.util.module_from_spec(_spec)\n"
        "sys.modules['_reconcile_replay'] = _mod\n"
        "_spec.loader.exec_module(_mod)\n"
        "_mod.hook()\n")
    return site


# ---- replaying ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Difference:
    call: int  # its place in the record
    test: str
    event: str
    field: str
    recorded: Any
    replayed: Any


def records(directory: Path) -> Iterator[dict[str, Any]]:
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                yield json.loads(line)


def replay(directory: Path) -> tuple[int, list[Difference]]:
    """(calls replayed, the differences) of the record in `directory` on this code."""
    from grpo_operator import reconcile as rec

    known = _input_types()
    calls, found = 0, []
    for line in records(directory):
        calls += 1
        args = decode(line["in"], known)
        action = rec.reconcile(args["job"], args["observed"], args["event"], args["now"],
                               args["config"])
        now = json.loads(json.dumps(action_record(action)))
        for field in COMPARED:
            if now[field] != line["out"][field]:
                found.append(Difference(calls, line["test"], line["in"]["event"]["__type__"], field,
                                        line["out"][field], now[field]))
    return calls, found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_testbed.reconcile_replay")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("hook", help="write DIR/sitecustomize.py").add_argument("dir", type=Path)
    play = sub.add_parser("replay", help="replay a record on this code")
    play.add_argument("dir", type=Path)
    play.add_argument("--show", type=int, default=10, help="differences to print")
    args = parser.parse_args(argv)
    if args.command == "hook":
        print(write_hook(args.dir))
        return 0
    calls, found = replay(args.dir)
    for d in found[: args.show]:
        print(f"{d.test} [{d.event}] {d.field}:\n  recorded {json.dumps(d.recorded)[:2000]}"
              f"\n  replayed {json.dumps(d.replayed)[:2000]}")
    print(f"{calls} reconcile() calls replayed, {len(found)} difference(s) in "
          f"{len({d.call for d in found})} call(s)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
