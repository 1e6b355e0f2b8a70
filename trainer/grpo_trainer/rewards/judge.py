"""A reward model behind an HTTP endpoint (``reward.type: http``).

One POST per response, JSON in and out (docs/rewards.md)::

    {"prompt": ..., "response": ..., "ground_truth": ..., "index": ...,
     "row": {every other column that JSON can carry}, "images": [base64, ...]}

The answer is a number, or an object with ``score`` (or ``overall``) and optionally
``accuracy`` and other numbers. Each request has ``timeout_s``; a connection error, a
timeout, a 429 or a 5xx is retried ``retries`` times with backoff; a 4xx other than 429 is
not (the request itself is wrong). A response whose every try failed raises, which the
runner turns into a zero reward counted in reward/failed: the step goes on. The runner's
threads (``concurrency`` of them) bound the requests in flight.
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from grpo_api.trainer_config import JudgeConfig

from ..config_error import ConfigError
from .sample import RewardSample

# Seconds before retry k (from 0): 0.5, 1, 2, 4, then 8 at most.
BACKOFF_FIRST_S = 0.5
BACKOFF_MAX_S = 8.0


class JudgeFailed(RuntimeError):
    """Every try of one request failed; the message says how the last one did."""


def backoff_s(retry: int) -> float:
    return float(min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2**retry))


def deadline_s(cfg: JudgeConfig) -> float:
    """The longest one response's scoring can take: every try and every pause (the
    runner's timeout for a judge)."""
    return (cfg.retries + 1) * cfg.timeout_s + sum(backoff_s(k) for k in range(cfg.retries)) + 1


def json_safe(value: Any) -> Any:
    """A column's value as JSON carries it: bytes as base64 text, other unknown types as
    their text."""
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, Mapping):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def request_body(sample: RewardSample, send_images: bool) -> dict[str, Any]:
    row = sample.source
    body: dict[str, Any] = {
        "prompt": sample.prompt, "response": sample.response,
        "ground_truth": sample.ground_truth, "index": sample.index,
        "response_length": sample.response_length,
        "row": {k: json_safe(v) for k, v in row.columns.items() if k != row.image_key},
    }
    if send_images:
        body["images"] = [base64.b64encode(b).decode("ascii") for b in row.image_bytes()]
    return body


def judge_answer(answer: Any) -> Any:
    """The judge's JSON as a reward value: a number, or its object with ``score`` named
    ``overall`` (the runner's key)."""
    if isinstance(answer, Mapping) and "overall" not in answer and "score" in answer:
        return {"overall": answer["score"], **{k: v for k, v in answer.items() if k != "score"}}
    return answer


class Judge:
    """Calls the endpoint for one sample (thread-safe: one urllib request per call)."""

    def __init__(self, cfg: JudgeConfig, token: str | None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.cfg = cfg
        self.headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if token:
            self.headers["Authorization"] = f"Bearer {token}"
        self.sleep = sleep

    def _post(self, data: bytes) -> Any:
        req = urllib.request.Request(self.cfg.url, data=data, headers=self.headers,
                                     method="POST")
        with urllib.request.urlopen(req, timeout=self.cfg.timeout_s) as resp:
            return json.loads(resp.read())

    def __call__(self, sample: RewardSample) -> Any:
        data = json.dumps(request_body(sample, self.cfg.send_images)).encode()
        last = ""
        for attempt in range(self.cfg.retries + 1):
            if attempt:
                self.sleep(backoff_s(attempt - 1))
            try:
                return judge_answer(self._post(data))
            except urllib.error.HTTPError as err:
                last = f"HTTP {err.code} {err.reason}"
                if 400 <= err.code < 500 and err.code != 429:
                    break  # the request is wrong: a retry would be too
            except (OSError, json.JSONDecodeError) as err:  # refused, reset, timed out
                last = f"{type(err).__name__}: {err}"
        tries = "1 try" if not attempt else f"{attempt + 1} tries"
        raise JudgeFailed(f"{self.cfg.url}: {last} ({tries})")


def judge_from_env(cfg: JudgeConfig, env: Mapping[str, str] = os.environ) -> Judge:
    """The judge with its token read from the env var ``token_env`` names (from a Secret:
    the token is never in the config)."""
    token = None
    if cfg.token_env:
        token = env.get(cfg.token_env)
        if not token:
            raise ConfigError("reward.http.token_env", f"the env var {cfg.token_env} is not "
                              "set in the driver's environment: set it from a Secret in "
                              "spec.pods.head.env")
    return Judge(cfg, token)
