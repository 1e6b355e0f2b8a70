"""`grpo plan`'s edge that reads a job's config.json from this machine, from where the
operator reads it in the cluster (reconcile/model_config.py), so the two plan alike:

- spec.model.shape: nothing is read;
- a hub id: the operator's own GET (hub_url, hub_config.read: the same URL, answer and
  Authorization header), with the token of --hub-token or HF_TOKEN only for a job that
  sets spec.hub.tokenSecret (the operator's reader pod sends the Secret's token then, and
  none otherwise, so a private repo that the cluster cannot read is not read here either).
  --offline reads no hub, as an operator that cannot reach one;
- a model on a claim (spec.model.claimName): a local copy of the claim, given by
  --model-root (the pods mount the claim at /models), else the path as it is here;
- any other path: that directory here (an absolute one below --model-root).

What the operator does with a read that fails, this does too: a model the known table
has is planned from the table (with a warning saying why), any other is refused with what
was read, the error and the fix. The token is sent, never printed: no message holds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from grpo_api.contract import MODEL_MOUNT
from grpo_api.model.shape import known_family
from grpo_api.model_config import CONFIG_FILE, ConfigUnavailable, read_dir, shape_fields

from . import hub_config
from .hub_endpoints import with_endpoint_url
from .reconcile.model_config import how_read, hub_url, read_source, where_read

SHAPE_FIX = "set spec.model.shape (parameters, layers, hiddenSize, ...)"


class ModelUnreadable(ValueError):
    """No config.json could be read for a model the known table does not have."""


@dataclass(frozen=True)
class HubAccess:
    """How `grpo plan` may reach the hub: the user's token, or not at all."""

    token: str | None = None
    offline: bool = False
    # The cluster's hub endpoints (the chart's hubEndpoints), for a job that names one.
    endpoints: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ModelRead:
    """What the planner gets (plan_memory's model_config and model_source), and a warning
    for stderr when the known table stands in for a config.json that was not read."""

    config: dict[str, Any] | None = None
    source: str | None = None
    warning: str | None = None


def read_model(raw_spec: dict[str, Any], model_root: Path | None, hub: HubAccess) -> ModelRead:
    """The config.json of the job's model (`raw_spec`: the spec as written), read as the
    operator reads it. Raises ModelUnreadable when none can be read for a model the
    known table does not have, SpecError for a hub name `hub.endpoints` does not have."""
    model = raw_spec.get("model") or {}
    path = str(model.get("path") or "")
    how = how_read(raw_spec)
    if how == "shape":
        return ModelRead()
    # A hub by name (the cluster's list, given here) or by URL (this machine reads any).
    raw_spec = with_endpoint_url(raw_spec, hub.endpoints, any_url=True)
    if model.get("claimName"):
        return _claim(raw_spec, path, model_root)
    if how in ("hub", "pod"):  # "pod": a private repo, read with the token
        return _hub(raw_spec, path, hub)
    return _local(path, model_root)


def _unread(path: str, note: str, fix: str) -> ModelRead:
    """No config.json: the known table, as the operator plans such a model, or refused."""
    known = known_family(path)
    if known is None:
        raise ModelUnreadable(f"spec.model.path: {note}; {path!r} is not a model the known "
                              f"table has, so nothing sizes it. Fix: {fix}")
    return ModelRead(None, note, f"spec.model: {note}; planned from the known table "
                                 f"({known[0]}), as the operator would. To plan from "
                                 f"config.json: {fix}")


def _hub(raw_spec: dict[str, Any], path: str, hub: HubAccess) -> ModelRead:
    url = hub_url(raw_spec)
    private = bool((raw_spec.get("hub") or {}).get("tokenSecret"))
    if hub.offline:
        return _unread(path, f"{url} not read (--offline)",
                       f"run without --offline (and GRPO_PLAN_OFFLINE, HF_HUB_OFFLINE unset), "
                       f"or {SHAPE_FIX}")
    answer = hub_config.read(url, token=hub.token if private else None)
    if answer.config is not None:
        return ModelRead(answer.config, read_source("hub", url))
    if answer.retry:
        fix = ("reach the hub from here (spec.hub.endpoint names a mirror), plan as an "
               f"operator that cannot reach it with --offline, or {SHAPE_FIX}")
    elif private and not hub.token:
        fix = ("spec.hub.tokenSecret is set: give grpo plan the same token with --hub-token "
               f"or HF_TOKEN; or {SHAPE_FIX}")
    elif private:
        fix = f"check the token of --hub-token / HF_TOKEN, and spec.model.path; or {SHAPE_FIX}"
    else:
        fix = ("check spec.model.path and spec.model.revision; a private or gated repo needs "
               "spec.hub.tokenSecret, and grpo plan its token (--hub-token or HF_TOKEN); or "
               f"{SHAPE_FIX}")
    return _unread(path, f"hub config.json unreadable: {answer.error}", fix)  # the operator's


def _candidates(path: str, model_root: Path | None) -> list[Path]:
    """Where a copy of the claim holds the model: below --model-root as the claim's
    files (/models/sft -> ROOT/sft), or as the pods' filesystem (ROOT/models/sft, what
    --model-root meant before claims were read); without it, the path as it is here."""
    pod = PurePosixPath(path)
    if model_root is None:
        return [Path(path)]
    out = []
    if pod.is_relative_to(MODEL_MOUNT):
        out.append(model_root / pod.relative_to(MODEL_MOUNT))
    out.append(model_root / (pod.relative_to("/") if pod.is_absolute() else pod))
    return list(dict.fromkeys(out))


def _claim(raw_spec: dict[str, Any], path: str, model_root: Path | None) -> ModelRead:
    where = where_read(raw_spec)
    claim = (raw_spec.get("model") or {}).get("claimName")
    errors = []
    for base in _candidates(path, model_root):
        try:
            config = shape_fields(read_dir(base))
        except ConfigUnavailable as exc:
            errors.append(str(exc))
            continue
        return ModelRead(config, f"{read_source('claim', where)}, read from "
                                 f"{base / CONFIG_FILE}")
    inside = PurePosixPath(path)
    rel = inside.relative_to(MODEL_MOUNT) if inside.is_relative_to(MODEL_MOUNT) else inside
    looked = "; ".join(errors)
    if model_root is None:
        return _unread(path, f"{where} is on a claim grpo plan cannot mount ({looked})",
                       f"pass --model-root DIR, DIR holding a copy of claim {claim} "
                       f"(config.json at DIR/{rel}/config.json); or {SHAPE_FIX}")
    return _unread(path, f"{where} is not below --model-root {model_root} ({looked})",
                   f"copy claim {claim} to --model-root (config.json at "
                   f"{model_root}/{rel}/config.json); or {SHAPE_FIX}")


def _local(path: str, model_root: Path | None) -> ModelRead:
    """A path on no claim: the operator plans it from the known table; here the
    directory is read when it exists (a model on this machine)."""
    base = Path(path)
    if model_root is not None and base.is_absolute():
        base = model_root / base.relative_to("/")
    if not (base / CONFIG_FILE).is_file():
        if known_family(path) is not None:  # as the operator plans it: no warning
            return ModelRead()
        return _unread(path, f"no {base / CONFIG_FILE} here", (
            f"{'a' if model_root is None else 'another'} --model-root DIR (an absolute path is "
            "read below it); or put the model on a claim (spec.model.claimName) or the hub, "
            f"where the operator reads its config.json; or {SHAPE_FIX}"))
    try:
        config = shape_fields(read_dir(base))
    except ConfigUnavailable as exc:
        raise ModelUnreadable(f"spec.model.path: {exc}") from None
    return ModelRead(config, f"config.json ({base / CONFIG_FILE})")
