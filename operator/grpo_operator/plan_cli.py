"""The logic behind `grpo plan` (the click command in cli.py stays thin).

Every GRPOJob in the file is checked as the API server and the webhook check it (the
CRD's name rule, the models, then the plan and the trainer config that admission
renders) and planned; every other document is named in a warning, so nothing in the
file is skipped in silence."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from grpo_api.contract import KIND
from grpo_api.job import GRPOJob, SpecError, load_documents, parse_manifest

from .catalog_file import load_catalog
from .job_defaults import NO_JOB_DEFAULTS, JobDefaults, with_job_defaults
from .plan_model import HubAccess, read_model
from .planner import InfeasibleError, Plan, plan_to_dict
from .planner.report import plan_tables
from .reconcile.planning import checked_plan
from .render.names import job_name_problem

# The API server completes metadata.generateName with five random characters.
_GENERATED_SUFFIX = "x0x0x"


def name_problem(metadata: dict[str, Any]) -> str | None:
    """What the CRD's metadata.name rule (and the API server) would refuse, or None."""
    name = metadata.get("name")
    if name is None and metadata.get("generateName"):
        problem = job_name_problem(f"{metadata['generateName']}{_GENERATED_SUFFIX}")
        return f"metadata.generateName: {problem}" if problem else None
    if not name:
        return "metadata.name: required (kubectl apply names the object by it)"
    problem = job_name_problem(str(name))
    return f"metadata.name: {problem}" if problem else None


def _describe(doc: Any) -> str:
    if not isinstance(doc, dict):
        return "is not a Kubernetes object"
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"(kind {doc.get('kind') or '?'}{f', name {name}' if name else ''}) is not a {KIND}"


def _job(doc: dict[str, Any], source: str) -> GRPOJob:
    job = parse_manifest(doc, source)
    problem = name_problem(job.metadata)
    if problem:
        raise SpecError([problem], source)
    return job


def plan_file(
    path: Path, output: str, model_root: Path | None, console: Console, catalog: Path | None = None,
    hub: HubAccess | None = None, defaults: JobDefaults = NO_JOB_DEFAULTS,
    namespace: str | None = None,
) -> int:
    """Plan every GRPOJob in `path` and print each plan (json: one object, or a list of
    those planned when the file holds several jobs); warn on stderr about every other
    document. Each model's config.json is read as the operator reads it (plan_model.py;
    `hub`: the token, or offline), with the platform's `defaults` for the job's namespace
    (`namespace`, else its metadata.namespace, else default). Returns how many GRPOJobs
    were refused, each with its reason on stderr. Raises SpecError for a file that is
    not YAML or holds no GRPOJob, ValueError for a bad catalog file."""
    err = Console(stderr=True, soft_wrap=True)
    gpus = load_catalog(catalog)
    jobs, others = load_documents(path)
    for i, doc in others:
        err.print(f"Warning: {path}: document {i} {_describe(doc)}; not planned", markup=False)
    several = len(jobs) + len(others) > 1
    plans: list[tuple[str, Plan]] = []
    for i, doc in jobs:
        where = f"{path}: document {i}" if several else str(path)
        meta = doc.get("metadata") if isinstance(doc.get("metadata"), dict) else {}
        inherited = with_job_defaults(doc.get("spec") if isinstance(doc.get("spec"), dict)
                                      else {}, defaults,
                                      namespace or str(meta.get("namespace") or "default"))
        if isinstance(doc.get("spec"), dict):
            doc = {**doc, "spec": inherited.raw_spec}
        for field, source in inherited.origins.items():
            err.print(f"Inherited: {field} from {source}", markup=False)
        try:
            job = _job(doc, where)
        except SpecError as exc:  # names its document
            err.print(f"error: {exc}", markup=False)
            continue
        name = str(job.metadata["name"]) if job.metadata.get("name") else path.name
        for warning in job.spec.deprecation_warnings():  # stderr: stdout stays clean
            err.print(f"Warning: {warning}", markup=False)
        try:
            read = read_model(doc.get("spec") or {}, model_root, hub or HubAccess())
            if read.warning:
                err.print(f"Warning: {read.warning}", markup=False)
            plans.append((name, checked_plan(job.spec, gpus, model_config=read.config,
                                             model_source=read.source)))
        except (SpecError, InfeasibleError, ValueError) as exc:
            job_of = f"{where} (GRPOJob {name}): " if several else ""
            err.print(f"error: {job_of}{exc}", markup=False)
    _print(plans, len(jobs) > 1, output, path, console)
    return len(jobs) - len(plans)


def _print(plans: list[tuple[str, Plan]], several: bool, output: str, path: Path,
           console: Console) -> None:
    if output == "json" and plans:  # machine output: plain text, no rich markup or wrapping
        data = [plan_to_dict(p) for _, p in plans]
        print(json.dumps(data if several else data[0], indent=2))
    elif output == "yaml" and plans:
        print(yaml.safe_dump_all([plan_to_dict(p) for _, p in plans], sort_keys=False), end="")
    elif output == "table":
        for name, plan in plans:
            console.print(plan_tables(plan, f"Plan for GRPOJob {name} ({path})"))
