"""The longest context a model's config.json allows, and the job's context against it.

The rollout engine holds a whole sample, maxPromptLength + maxResponseLength tokens
(the trainer's vLLM max_model_len), and vLLM refuses a max_model_len above what it
derives from config.json (vllm/config/model.py, _get_and_verify_max_len): the language
model's max_position_embeddings, times the rope scaling factor. Configs that extend
their positions do not agree on what max_position_embeddings means there: YaRN, longrope
and llama3 configs give either the extended length or the pretrained one beside
original_max_position_embeddings, and readers (vLLM, transformers) differ. The planner
takes the longest length any reading gives (the original x the factor, or
max_position_embeddings x the factor without an original), says it assumed it, and
refuses only a context beyond that. A config without max_position_embeddings (or a
shape from spec.model.shape or the known table) is not checked. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from grpo_api.job.spec import GRPOJobSpec

from .types import Decision

PROMPT, RESPONSE = "spec.data.maxPromptLength", "spec.data.maxResponseLength"
MIN_LENGTH = 16  # the schema's least maxPromptLength and maxResponseLength


@dataclass(frozen=True)
class Positions:
    """What config.json says about the model's context."""

    stated: int  # max_position_embeddings
    limit: int  # the longest context the plan allows (stated, or extended by rope scaling)
    assumed: str = ""  # how a rope scaling extends `stated` to `limit` ("": it does not)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _rope(part: Mapping[str, Any]) -> tuple[str, float, int | None] | None:
    """(type, factor, original positions) of a rope scaling with a factor above 1, or None.
    transformers 5 writes rope_parameters (per layer type for some models), older
    versions rope_scaling; model_config.shape_fields keeps only such a scaling."""
    for key in ("rope_scaling", "rope_parameters"):
        rope = part.get(key)
        if not isinstance(rope, Mapping):
            continue
        nested = [r for r in rope.values() if isinstance(r, Mapping)]
        for r in nested or [rope]:
            factor = _number(r.get("factor"))
            if factor is not None and factor > 1:
                original = _number(r.get("original_max_position_embeddings"))
                kind = str(r.get("rope_type") or r.get("type") or "?")
                return kind, factor, int(original) if original else None
    return None


def model_positions(config: Mapping[str, Any] | None) -> Positions | None:
    """The context config.json allows (the language model's: text_config first, as the
    newer VLM layouts nest it), or None when it states none."""
    if not config:
        return None
    text = config.get("text_config")
    parts = [p for p in (text, config) if isinstance(p, Mapping)]
    stated = next((int(n) for p in parts
                   if (n := _number(p.get("max_position_embeddings"))) and n >= 1), None)
    if stated is None:
        return None
    rope = next((r for p in parts if (r := _rope(p)) is not None), None)
    if rope is None:
        return Positions(stated, stated)
    kind, factor, original = rope
    limit = int(max(stated, original * factor) if original else stated * factor)
    if limit <= stated:
        return Positions(stated, stated)
    how = (f"original_max_position_embeddings {original} x {factor:g}" if original
           else f"max_position_embeddings {stated} x {factor:g}")
    return Positions(stated, limit, f"rope scaling {kind} (factor {factor:g}) extends "
                                    f"it to {how} = {limit}, assumed: readers of such "
                                    "configs differ, and this is the longest any allows")


def context_problem(spec: GRPOJobSpec, positions: Positions, source: str) -> str | None:
    """A context longer than the model's positions: the fields, the limit and where it
    comes from, and the fix; None when it fits."""
    prompt, response = spec.data.max_prompt_length, spec.data.max_response_length
    if prompt + response <= positions.limit:
        return None
    limit = positions.limit
    where = f"max_position_embeddings {positions.stated} in {source}" + (
        f"; {positions.assumed}" if positions.assumed else "")
    share = max(MIN_LENGTH, limit * prompt // (prompt + response))  # both cut alike
    cut = (f"{RESPONSE}: {limit - prompt}" if limit - prompt >= MIN_LENGTH
           else f"{PROMPT}: {limit - response}" if limit - response >= MIN_LENGTH
           else f"{PROMPT}: {share} and {RESPONSE}: {limit - share}")
    return (f"{PROMPT} + {RESPONSE}: {prompt} + {response} = {prompt + response} tokens, "
            f"more than the {limit} positions of the model ({where}): vLLM refuses a sample "
            f"longer than that (its max_model_len), and the model never saw positions beyond "
            f"it. Fix: lower them to at most {limit} together, e.g. {cut}; or use a model "
            "with a longer context")


def context_decision(spec: GRPOJobSpec, positions: Positions, source: str) -> Decision:
    """The plan's line for a context that fits the model's positions."""
    prompt, response = spec.data.max_prompt_length, spec.data.max_response_length
    within = (f"max_position_embeddings {positions.stated} ({source})"
              if not positions.assumed else
              f"the {positions.limit} positions of the model: max_position_embeddings "
              f"{positions.stated} ({source}); {positions.assumed}")
    return Decision("context", f"{prompt + response} of {positions.limit}", "auto",
                    f"data.maxPromptLength {prompt} + maxResponseLength {response} within "
                    f"{within}")
