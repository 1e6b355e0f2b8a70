"""The HTTP judge (reward.type http) against a real HTTP server on the loopback: what it
sends, the token, retries with backoff, a timeout, the concurrency limit, and failures
counted as zero rewards, never raised."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from grpo_api.trainer_config import DataConfig, JudgeConfig, RewardConfig
from grpo_trainer.config_error import ConfigError
from grpo_trainer.data import Record
from grpo_trainer.rewards import RewardRunner, RewardSample, resolve_reward, reward_rows
from grpo_trainer.rewards.judge import Judge, deadline_s, judge_from_env
from grpo_trainer.tiny.data import png

pytestmark = pytest.mark.unit

TOKEN = "s3cr3t-judge-token"


@dataclass
class JudgeServer:
    """A judge on 127.0.0.1: ``answer(body, n)`` gives (status, JSON, delay) for the n-th
    request (from 1); every request's body and headers are kept."""

    answer: Callable[[dict[str, Any], int], tuple[int, Any, float]]
    bodies: list[dict[str, Any]] = field(default_factory=list)
    auth: list[str | None] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)
    url: str = ""


@pytest.fixture
def judge_server() -> Iterator[Callable[..., JudgeServer]]:
    servers: list[ThreadingHTTPServer] = []

    def start(answer: Callable[[dict[str, Any], int], tuple[int, Any, float]]) -> JudgeServer:
        state = JudgeServer(answer)

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with state.lock:
                    state.bodies.append(body)
                    state.auth.append(self.headers.get("Authorization"))
                    state.in_flight += 1
                    state.most_in_flight = max(state.most_in_flight, state.in_flight)
                    n = len(state.bodies)
                status, payload, delay = state.answer(body, n)
                time.sleep(delay)
                with state.lock:
                    state.in_flight -= 1
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        state.url = f"http://127.0.0.1:{server.server_address[1]}/score"
        return state

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


def samples(n: int, images: int = 0) -> list[RewardSample]:
    data = DataConfig(train_files=["unused.jsonl"])
    records = [Record(i, f"<image>what is {i}?", str(i),
                      images=[png((0, 0, 0), (20, 20))] * images) for i in range(n)]
    rows = reward_rows(records, data, whole=True)
    for row in rows:
        row.columns = {**row.columns, "topic": f"t{row.index}"}
    return [RewardSample(f"the answer is {r.index}", 4, r) for r in rows]


def runner(url: str, sleeps: list[float] | None = None, **judge: Any) -> RewardRunner:
    cfg = RewardConfig(type="http", http=JudgeConfig(url=url, **judge))
    assert cfg.http is not None
    slept = sleeps if sleeps is not None else []
    return RewardRunner(resolve_reward(cfg, Judge(cfg.http, TOKEN, sleep=slept.append)),
                        cfg.http.concurrency, deadline_s(cfg.http))


def test_the_judge_gets_the_row_and_the_token_and_its_score_is_the_reward(
        judge_server: Callable[..., JudgeServer]) -> None:
    srv = judge_server(lambda body, n: (200, {"score": 0.75, "accuracy": 1, "style": 0.5}, 0))
    r = runner(srv.url)
    out = r.score(samples(2, images=1))
    r.close()
    assert [(x.score, x.accuracy, dict(x.extras)) for x in out] == [(0.75, 1.0, {"style": 0.5})] * 2
    body = sorted(srv.bodies, key=lambda b: b["index"])[1]
    assert body["prompt"] == "<image>what is 1?" and body["ground_truth"] == "1"
    assert body["response"] == "the answer is 1" and body["response_length"] == 4
    assert body["row"]["topic"] == "t1" and "images" not in body["row"]
    assert "images" not in body  # only with sendImages
    assert srv.auth == [f"Bearer {TOKEN}"] * 2


def test_images_are_sent_when_asked(judge_server: Callable[..., JudgeServer]) -> None:
    import base64
    srv = judge_server(lambda body, n: (200, 1.0, 0))
    r = runner(srv.url, send_images=True)
    assert r.score(samples(1, images=2))[0].score == 1.0
    r.close()
    assert [base64.b64decode(x) for x in srv.bodies[0]["images"]] == [png((0, 0, 0), (20, 20))] * 2


def test_a_busy_judge_is_retried_with_backoff(judge_server: Callable[..., JudgeServer]) -> None:
    srv = judge_server(lambda body, n: (503, {"error": "busy"}, 0) if n <= 2 else (200, 0.5, 0))
    sleeps: list[float] = []
    r = runner(srv.url, sleeps, retries=2)
    out = r.score(samples(1))
    r.close()
    assert out[0].score == 0.5 and out[0].failed is None
    assert len(srv.bodies) == 3 and sleeps == [0.5, 1.0]


def test_a_refused_request_is_not_retried_and_scores_zero(
        judge_server: Callable[..., JudgeServer], caplog: pytest.LogCaptureFixture) -> None:
    srv = judge_server(lambda body, n: (400, {"error": "bad"}, 0))
    r = runner(srv.url, retries=3)
    out = r.score(samples(2))
    r.close()
    assert [x.score for x in out] == [0.0, 0.0] and len(srv.bodies) == 2
    assert all("HTTP 400" in (x.failed or "") and "(1 try)" in (x.failed or "") for x in out)
    assert "failed for 2 of 2 responses" in caplog.text
    assert TOKEN not in caplog.text


def test_a_slow_or_absent_judge_fails_its_samples_and_the_step_goes_on(
        judge_server: Callable[..., JudgeServer], caplog: pytest.LogCaptureFixture) -> None:
    srv = judge_server(lambda body, n: (200, 1.0, 2.0 if body["index"] == 0 else 0))
    r = runner(srv.url, retries=1, timeout_s=0.3)
    out = r.score(samples(2))
    r.close()
    assert out[0].score == 0.0 and "timed out" in (out[0].failed or "").lower()
    assert "(2 tries)" in (out[0].failed or "")
    assert out[1].score == 1.0 and out[1].failed is None
    # Nothing listens: refused, retried, counted.
    gone = runner("http://127.0.0.1:9/score", retries=1)
    res = gone.score(samples(1))[0]
    gone.close()
    assert res.score == 0.0 and "Connection refused" in (res.failed or "")
    assert TOKEN not in caplog.text


def test_no_more_requests_in_flight_than_the_concurrency(
        judge_server: Callable[..., JudgeServer]) -> None:
    srv = judge_server(lambda body, n: (200, 1.0, 0.2))
    r = runner(srv.url, concurrency=2)
    assert [x.score for x in r.score(samples(6))] == [1.0] * 6
    r.close()
    assert srv.most_in_flight == 2


def test_the_token_comes_from_the_env_var_the_config_names() -> None:
    cfg = JudgeConfig(url="http://judge:8000/score", token_env="JUDGE_TOKEN")
    assert judge_from_env(cfg, {"JUDGE_TOKEN": TOKEN}).headers["Authorization"] == \
        f"Bearer {TOKEN}"
    with pytest.raises(ConfigError) as err:
        judge_from_env(cfg, {})
    assert err.value.field == "reward.http.token_env"
    assert "JUDGE_TOKEN is not set" in str(err.value) and "spec.pods.head.env" in str(err.value)
    assert "Authorization" not in judge_from_env(JudgeConfig(url="http://j/s"), {}).headers
