"""Parsing GRPOJob manifests with errors that name the field (camelCase path) and the fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, Field, ValidationError

from ..contract import API_GROUP, API_VERSION, KIND
from .base import ApiModel
from .spec import GRPOJobSpec
from .status import GRPOJobStatus

API_VERSION_FULL = f"{API_GROUP}/{API_VERSION}"
# The Literal types below spell the contract's names out (typing needs literals).
assert API_VERSION_FULL == "grpo.dev/v1alpha1" and KIND == "GRPOJob"


class SpecError(ValueError):
    """A manifest or spec is invalid; `problems` are "path: message" lines."""

    def __init__(self, problems: list[str], source: str = "GRPOJob") -> None:
        self.problems = problems
        super().__init__(f"{source} is invalid:\n  " + "\n  ".join(problems))


class GRPOJob(ApiModel):
    """A whole GRPOJob object as stored by the API server."""

    api_version: Literal["grpo.dev/v1alpha1"] = Field("grpo.dev/v1alpha1", alias="apiVersion")
    kind: Literal["GRPOJob"] = "GRPOJob"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: GRPOJobSpec
    status: GRPOJobStatus | None = None


# Strict types, like the API server; say how to write the value.
_HINTS = {
    "bool_type": "write true or false, unquoted",
    "int_type": "write a whole number, unquoted",
    "float_type": "write a number, unquoted",
    "string_type": "write a string; quote values YAML would read as numbers or booleans",
}


def _unknown_field(root: type[BaseModel], loc: tuple[int | str, ...]) -> str:
    """The message for an unknown field at `loc`: its model's own hint (a model with
    `unknown_field_hint`, e.g. spec.trainer, knows where a planned setting goes), else the
    fields it knows."""
    model = _model_at(root, loc[:-1])
    hint = getattr(model, "unknown_field_hint", None)
    if hint is not None and (said := hint(str(loc[-1]))):
        return f"unknown field; {said}"
    known = None if model is None else sorted(
        (f.alias or n) for n, f in model.model_fields.items())
    return "unknown field" + (f"; known fields: {', '.join(known)}" if known else "")


def _model_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model that holds the fields at `loc` (the parent of an unknown field)."""
    model: Any = root
    for part in loc:
        if isinstance(part, int):
            continue
        fields = {(f.alias or n): f for n, f in model.model_fields.items()}
        if part not in fields:
            return None
        annotation = fields[part].annotation
        candidates = [annotation, *getattr(annotation, "__args__", ())]
        nxt = next(
            (c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None
        )
        if nxt is None:
            return None
        model = nxt
    return model


def format_errors(
    exc: ValidationError, root: type[BaseModel], prefix: tuple[str, ...] = ()
) -> list[str]:
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        path = ".".join([*prefix, *(f"[{p}]" if isinstance(p, int) else str(p) for p in loc)])
        path = path.replace(".[", "[") or "(root)"
        msg = str(err["msg"]).removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = _unknown_field(root, loc)
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif err["type"] in _HINTS:
            msg = f"{msg} ({_HINTS[err['type']]})"
        problems.append(f"{path}: {msg}")
    return problems


def parse_spec(spec: dict[str, Any]) -> GRPOJobSpec:
    """Validate a spec dict (camelCase), raising SpecError with "spec.a.b: ..." lines."""
    try:
        return GRPOJobSpec.model_validate(spec, by_alias=True, by_name=False)
    except ValidationError as exc:
        raise SpecError(format_errors(exc, GRPOJobSpec, ("spec",))) from None


def parse_manifest(doc: Any, source: str = "GRPOJob") -> GRPOJob:
    """Validate a whole object; `status` is accepted but optional."""
    if not isinstance(doc, dict):
        raise SpecError(
            ["(root): expected a mapping with apiVersion, kind, metadata, spec"], source
        )
    try:
        return GRPOJob.model_validate(doc, by_alias=True, by_name=False)
    except ValidationError as exc:
        raise SpecError(format_errors(exc, GRPOJob), source) from None


Numbered = list[tuple[int, Any]]  # YAML documents with their 1-based place in the file


def load_documents(path: str | Path) -> tuple[Numbered, Numbered]:
    """The GRPOJob documents of a YAML file and the other ones, empty ones left out;
    SpecError when the file is not YAML or holds no GRPOJob."""
    try:
        docs = list(enumerate(yaml.safe_load_all(Path(path).read_text()), start=1))
    except yaml.YAMLError as exc:
        raise SpecError([f"(root): not valid YAML: {exc}"], str(path)) from None
    docs = [(i, d) for i, d in docs if d is not None]
    jobs = [(i, d) for i, d in docs if isinstance(d, dict) and d.get("kind") == KIND]
    if not jobs:
        raise SpecError([f"(root): no document of kind {KIND} in the file"], str(path))
    found = {i for i, _ in jobs}
    return jobs, [(i, d) for i, d in docs if i not in found]


def load_manifest(path: str | Path) -> GRPOJob:
    """Read one GRPOJob from a YAML file (the first document of kind GRPOJob)."""
    jobs, _ = load_documents(path)
    return parse_manifest(jobs[0][1], str(path))
