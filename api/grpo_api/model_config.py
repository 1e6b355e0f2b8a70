"""A model's config.json as the memory planner needs it: where to read it (a directory,
or a hub's `resolve` URL), the part of it that sizes the model, and the report a reader
pod writes to its termination message for the operator.

Both sides use this module: the operator reads public hub repos itself, and runs
`python -m grpo_api.model_config` in a small pod of the job's trainer image for a model
on a claim or in a private hub repo (its token stays in the job's Secret, which the
operator never reads). Standard library and pydantic only: the pod imports nothing else.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from .contract import TERMINATION_LOG, TERMINATION_MESSAGE_MAX_BYTES, Env

DEFAULT_HUB_ENDPOINT = "https://huggingface.co"  # huggingface_hub's, when spec.hub has none
DEFAULT_REVISION = "main"
CONFIG_FILE = "config.json"
HUB_TIMEOUT_S = 5.0  # one GET of a small file: a hub that takes longer is unreachable

# The language model's fields (top level in older VLM layouts and text models, under
# text_config in newer ones) and the vision tower's, that the planner's shape_from_config
# reads; model_type and architectures say which family it is. max_position_embeddings
# (with a rope scaling that extends it, ROPE_KEYS) bounds the job's context
# (planner/positions.py).
_IDENTITY = ("model_type", "architectures")
LM_KEYS = (*_IDENTITY, "hidden_size", "intermediate_size", "num_hidden_layers",
           "num_attention_heads", "num_key_value_heads", "head_dim", "vocab_size",
           "tie_word_embeddings", "attention_bias", "num_experts", "num_local_experts",
           "moe_intermediate_size", "num_experts_per_tok", "max_position_embeddings")
ROPE_KEYS = ("rope_scaling", "rope_parameters")  # transformers 4's name, and 5's
ROPE_FIELDS = ("rope_type", "type", "factor", "original_max_position_embeddings")
VISION_KEYS = (*_IDENTITY, "depth", "num_hidden_layers", "embed_dim", "hidden_size",
               "intermediate_size", "mlp_ratio", "hidden_act", "spatial_merge_size",
               "out_hidden_size", "patch_size", "temporal_patch_size", "in_channels",
               "num_position_embeddings", "deepstack_visual_indexes")


class ConfigUnavailable(Exception):
    """config.json could not be read. `retry`: the cause may pass (a hub that cannot be
    reached, a 5xx, a rate limit); otherwise it is the model's (no such file, not JSON)."""

    def __init__(self, message: str, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


def _extension(rope: Any) -> dict[str, Any] | None:
    """A rope scaling's fields that extend the positions (a factor), or None: the rest
    (theta, mrope sections) does not bound the context. transformers 5 may key it by
    layer type."""
    if not isinstance(rope, dict):
        return None
    if "factor" in rope:
        return {k: rope[k] for k in ROPE_FIELDS if k in rope}
    nested = {t: e for t, r in rope.items() if (e := _extension(r)) is not None}
    return nested or None


def _lm_fields(part: dict[str, Any]) -> dict[str, Any]:
    out = {k: part[k] for k in LM_KEYS if k in part}
    for key in ROPE_KEYS:
        if (extension := _extension(part.get(key))) is not None:
            out[key] = extension
    return out


def shape_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a config.json that sizes the model and bounds its context: a few
    hundred bytes of any family's file (which can run to kilobytes), so it fits a
    termination message."""
    out = _lm_fields(config)
    text, vision = config.get("text_config"), config.get("vision_config")
    if isinstance(text, dict):
        out["text_config"] = _lm_fields(text)
    if isinstance(vision, dict):
        out["vision_config"] = {k: vision[k] for k in VISION_KEYS if k in vision}
    return out


def hub_config_url(endpoint: str | None, repo: str, revision: str | None) -> str:
    """The hub's download URL of a repo's config.json (what huggingface_hub's
    hf_hub_url builds for a model repo)."""
    rev = urllib.parse.quote(revision or DEFAULT_REVISION, safe="")
    return f"{(endpoint or DEFAULT_HUB_ENDPOINT).rstrip('/')}/{repo}/resolve/{rev}/{CONFIG_FILE}"


def _parsed(text: str, where: str) -> dict[str, Any]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigUnavailable(f"{where} is not JSON: {exc}", retry=False) from None
    if not isinstance(data, dict):
        raise ConfigUnavailable(f"{where} is not a JSON object", retry=False)
    return data


def read_dir(path: str | Path) -> dict[str, Any]:
    """config.json of the model directory `path`; ConfigUnavailable naming what is there
    instead when it is not."""
    base = Path(path)
    file = base / CONFIG_FILE
    if not base.is_dir():
        parent = base.parent
        seen = sorted(p.name for p in parent.iterdir())[:20] if parent.is_dir() else []
        near = f" ({parent} holds: {', '.join(seen) or 'nothing'})" if parent.is_dir() else ""
        raise ConfigUnavailable(f"{base} is not a directory{near}", retry=False)
    if not file.is_file():
        seen = sorted(p.name for p in base.iterdir())[:20]
        raise ConfigUnavailable(f"{file} does not exist ({base} holds: "
                                f"{', '.join(seen) or 'nothing'})", retry=False)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigUnavailable(f"{file}: {exc}", retry=False) from None
    return _parsed(text, str(file))


def read_url(url: str, token: str | None = None,
             timeout_s: float = HUB_TIMEOUT_S) -> dict[str, Any]:
    """GET a hub's config.json. A 4xx is the repo's answer (no such repo or revision, or
    a private one without a valid token); no answer, a 5xx or 429 may pass."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=timeout_s) as response:
            text = response.read(1 << 20).decode()
    except urllib.error.HTTPError as exc:
        transient = exc.code >= 500 or exc.code == 429
        hint = "" if transient else (
            ": check spec.model.path and spec.model.revision; a private or gated repo needs "
            "spec.hub.tokenSecret")
        raise ConfigUnavailable(f"GET {url}: HTTP {exc.code} {exc.reason}{hint}",
                                retry=transient) from None
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        why = getattr(exc, "reason", None) or exc
        raise ConfigUnavailable(f"GET {url}: {why}", retry=True) from None
    except UnicodeDecodeError as exc:
        raise ConfigUnavailable(f"GET {url}: not text: {exc}", retry=False) from None
    return _parsed(text, url)


class ReaderReport(BaseModel):
    """The reader pod's termination message: the shape fields, or why it could not."""

    model_config = ConfigDict(extra="forbid")

    config: dict[str, Any] | None = None
    error: str | None = None
    retry: bool = False

    def to_message(self) -> str:
        text = self.model_dump_json(exclude_none=True)
        if len(text.encode()) <= TERMINATION_MESSAGE_MAX_BYTES:
            return text
        if self.config is not None:  # never: the shape fields are a few hundred bytes
            return ReaderReport(error=f"the shape fields of config.json take {len(text)} "
                                "bytes, more than a termination message holds").to_message()
        cut = (self.error or "")[:TERMINATION_MESSAGE_MAX_BYTES // 2]
        return ReaderReport(error=cut, retry=self.retry).model_dump_json(exclude_none=True)


def main(argv: list[str] | None = None) -> int:
    """The reader pod: exit 0 with the shape fields, 2 when the model's config.json is
    missing or bad, 1 when the hub could not be reached (the operator retries)."""
    ap = argparse.ArgumentParser(prog="python -m grpo_api.model_config")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--path", help="the model directory (on the claim mounted at /models)")
    where.add_argument("--url", help="a hub config.json URL; the token comes from HF_TOKEN")
    ap.add_argument("--out", default=os.environ.get(Env.TERMINATION_LOG.value, TERMINATION_LOG))
    args = ap.parse_args(argv)
    try:
        config = (read_dir(args.path) if args.path
                  else read_url(args.url, os.environ.get("HF_TOKEN") or None))
        report, code = ReaderReport(config=shape_fields(config)), 0
    except ConfigUnavailable as exc:
        report, code = ReaderReport(error=str(exc), retry=exc.retry), 1 if exc.retry else 2
    message = report.to_message()
    Path(args.out).write_text(message)
    print(message, file=sys.stderr if code else sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())
