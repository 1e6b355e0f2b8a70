"""The logic behind `grpo plan` (the click command in cli.py stays thin)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from rich.console import Console

from grpo_api.job import load_manifest

from .catalog_file import load_catalog
from .planner import plan_memory, plan_to_dict, read_model_config
from .planner.report import plan_tables


def plan_file(
    path: Path, output: str, model_root: Path | None, console: Console, catalog: Path | None = None
) -> None:
    """Plan the GRPOJob in `path` and print it; raises SpecError / InfeasibleError /
    ValueError (an unknown GPU type or a bad catalog file, with the reason)."""
    job = load_manifest(path)
    for warning in job.spec.deprecation_warnings():  # stderr: json/yaml output stays clean
        Console(stderr=True, soft_wrap=True).print(f"Warning: {warning}", markup=False)
    config = read_model_config(job.spec.model.path, model_root)
    plan = plan_memory(job.spec, load_catalog(catalog), model_config=config)
    if output == "json":  # machine output: plain text, no rich markup or wrapping
        print(json.dumps(plan_to_dict(plan), indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(plan_to_dict(plan), sort_keys=False), end="")
    else:
        name = job.metadata.get("name", path.name)
        console.print(plan_tables(plan, f"Plan for GRPOJob {name} ({path})"))
