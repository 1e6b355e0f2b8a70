"""The walkthrough's reward and judge (examples/quickstart/, docs/quickstart-cluster.md)
against the trainer's real reward machinery, in seconds: the reward file loaded by path as
a job loads it, and the judge served on 127.0.0.1 and called by the trainer's own HTTP
judge client. The e2e tier runs both in a cluster (tests/e2e/test_quickstart_cluster.py);
these say which side broke when it fails."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest

from grpo_api.trainer_config import DataConfig, JudgeConfig, RewardConfig
from grpo_testkit.script_modules import load_script
from grpo_trainer.data import Record
from grpo_trainer.rewards import RewardRunner, RewardSample, resolve_reward, reward_rows
from grpo_trainer.rewards.judge import Judge, deadline_s
from grpo_trainer.tiny.data import png

pytestmark = pytest.mark.unit

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "quickstart"
WIDTHS = (40, 48)


def samples() -> list[RewardSample]:
    """Two rows as make-tiny writes them (a question about an image, its answer), one
    response that says the answer and one that does not."""
    data = DataConfig(train_files=["unused.parquet"])
    records = [Record(i, f"<image>How many shapes? ({i})", str(i + 1),
                      images=[png((200, 0, 0), (w, 20))]) for i, w in enumerate(WIDTHS)]
    rows = reward_rows(records, data, whole=True)
    return [RewardSample("there are 1 shapes", 4, rows[0]),
            RewardSample("no idea", 2, rows[1])]


def judge_module() -> ModuleType:
    return load_script(EXAMPLES / "judge.py", "quickstart_judge")


@pytest.fixture
def judge_url() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), judge_module().Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/score"
    finally:
        server.shutdown()
        server.server_close()


def test_the_reward_file_reads_the_problem_column_and_the_image() -> None:
    cfg = RewardConfig(type="function", function=f"{EXAMPLES / 'reward.py'}:score")
    runner = RewardRunner(resolve_reward(cfg), 2, 30.0)
    out = runner.score(samples())
    runner.close()
    assert [(r.score, r.accuracy) for r in out] == [(1.0, 1.0), (0.0, 0.0)]
    assert [dict(r.extras) for r in out] == [
        {"asks_about_image": 1.0, "image_width": float(w)} for w in WIDTHS]


def test_the_judge_answers_the_trainers_judge_client(judge_url: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = RewardConfig(type="http", http=JudgeConfig(url=judge_url, send_images=True))
    assert cfg.http is not None
    runner = RewardRunner(resolve_reward(cfg, Judge(cfg.http, None)), cfg.http.concurrency,
                          deadline_s(cfg.http))
    out = runner.score(samples())
    runner.close()
    assert [r.score for r in out] == [1.0, 0.0]
    assert [dict(r.extras) for r in out] == [
        {"asks_about_image": 1.0, "image_width": float(w)} for w in WIDTHS]
    logged = sorted(line for line in capsys.readouterr().out.splitlines()
                    if line.startswith("scored row "))
    assert logged == [
        'scored row 0: {"asks_about_image": 1.0, "image_width": 40.0, "score": 1.0}',
        'scored row 1: {"asks_about_image": 1.0, "image_width": 48.0, "score": 0.0}']


def test_the_judge_refuses_another_path(judge_url: str) -> None:
    import urllib.error
    import urllib.request

    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(urllib.request.Request(
            judge_url.replace("/score", "/other"), data=b"{}", method="POST"), timeout=10)
    assert err.value.code == 404
