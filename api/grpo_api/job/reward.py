"""GRPOJob.spec.reward: how responses are scored (docs/rewards.md). The trainer's own
schema (grpo_api.trainer_config.RewardConfig) holds the same rules: reward_problem is
written once, below both."""

from __future__ import annotations

from typing import Self

from pydantic import ConfigDict, Field, JsonValue, model_validator

from ..trainer_config import (
    JUDGE_CONCURRENCY,
    JUDGE_MAX_CONCURRENCY,
    JUDGE_RETRIES,
    JUDGE_TIMEOUT_S,
    REWARD_FUNCTION_PATTERN,
    RewardType,
    reward_problem,
)
from .base import ApiModel, cel_rule
from .trainer import spec_setting


class JudgeSpec(ApiModel):
    """A reward model behind an HTTP endpoint, called by the driver on the head pod."""

    url: str = Field(
        pattern=r"^https?://[^\s]+$", max_length=2048,
        description="The judge's endpoint: each response is POSTed there as JSON "
        "(docs/rewards.md) and the answer's score is the reward.")
    timeout_seconds: float = Field(
        JUDGE_TIMEOUT_S, gt=0, le=3600, description="Seconds one request may take.")
    retries: int = Field(
        JUDGE_RETRIES, ge=0, le=10, description="Retries of a failed or timed-out request "
        "(with backoff); a response whose every try failed scores 0 and counts in "
        "reward/failed.")
    concurrency: int = Field(
        JUDGE_CONCURRENCY, ge=1, le=JUDGE_MAX_CONCURRENCY,
        description="Requests in flight at once.")
    send_images: bool = Field(
        False, description="Send each row's images too (base64 of their files, in "
        "'images'), for a judge that looks at them.")
    token_env: str | None = Field(
        None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="An env var of the head pod (set it from a Secret in spec.pods.head.env)"
        " whose value is sent as 'Authorization: Bearer <value>'.")


class RewardSpec(ApiModel):
    """How responses are scored (docs/rewards.md)."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                cel_rule(
                    "!has(self.type) || !(self.type in ['function', 'easyr1', 'verl']) "
                    "|| has(self.function)",
                    "reward.function (module:callable or /path/file.py:callable) is required "
                    "when reward.type is function, easyr1 or verl",
                    ".function",
                ),
                cel_rule(
                    "!has(self.type) || self.type != 'http' || has(self.http)",
                    "reward.http (the judge's url) is required when reward.type is http",
                    ".http",
                ),
            ]
        }
    )

    type: RewardType = Field(
        "math",
        description="math: boxed answer + <think> format; r1v: <answer> tags; function: "
        "yours (it gets the response and the whole row); easyr1: an EasyR1 reward function; "
        "verl: a verl compute_score; http: a judge behind an endpoint.",
    )
    function: str | None = Field(
        None,
        pattern=REWARD_FUNCTION_PATTERN,
        description="For type function, easyr1 or verl: module:callable (on PYTHONPATH) or "
        "/path/file.py:callable (a file in the head pod, e.g. from a mounted ConfigMap).",
    )
    batch: bool = Field(
        False, description="function or easyr1: one call per step with every response (a "
        "list), instead of one call per response.")
    kwargs: dict[str, JsonValue] | None = Field(
        None, json_schema_extra={"x-kubernetes-preserve-unknown-fields": True},
        description="Keyword arguments the function is called with (EasyR1's "
        "reward_function_kwargs, verl's reward_kwargs).")
    http: JudgeSpec | None = Field(
        None, description="For type http: the judge endpoint.")
    timeout_seconds: float | None = spec_setting(
        "reward.timeoutSeconds", "Seconds one reward call may take (a batch function's one call "
        "a step too); a slower one scores 0. A judge's requests have http.timeoutSeconds.")
    workers: int | None = spec_setting(
        "reward.workers", "Reward calls scored at once (threads of the driver); a "
        "judge's are http.concurrency.")
    format_weight: float = Field(
        0.1, ge=0, le=1, description="Weight of the format score in the reward."
    )

    @model_validator(mode="after")
    def _settings_fit_type(self) -> Self:
        problem = reward_problem(self.type, self.function, self.batch, bool(self.kwargs),
                                 self.http is not None)
        if problem:
            raise ValueError(problem)
        return self
