"""Reading a model's config.json: the reader pod's program (`python -m
grpo_api.model_config`, run here as a process) on a model directory and against a
hub, and the operator's own cached GET of a public hub repo. The hub is a STAND-IN
(grpo_testkit.hub: the hub's file API served from a local directory on
loopback); the files are written by transformers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_api.contract import TERMINATION_MESSAGE_MAX_BYTES
from grpo_api.model_config import ReaderReport, hub_config_url, shape_fields
from grpo_operator import hub_config
from grpo_operator.planner import shape_from_config
from grpo_testkit.hub import stand_in_hub
from grpo_testkit.tiny_configs import write_config

pytestmark = pytest.mark.unit


def reader(tmp_path: Path, *args: str, token: str | None = None) -> tuple[int, ReaderReport]:
    out = tmp_path / "termination-log"
    env = {"PATH": "/usr/bin:/bin", **({"HF_TOKEN": token} if token else {})}
    proc = subprocess.run([sys.executable, "-m", "grpo_api.model_config", *args,
                           "--out", str(out)], capture_output=True, text=True, timeout=60,
                          env={**env, "PYTHONPATH": ":".join(sys.path)})
    text = out.read_text()
    assert len(text.encode()) <= TERMINATION_MESSAGE_MAX_BYTES
    return proc.returncode, ReaderReport.model_validate_json(text)


def test_the_reader_reports_the_shape_fields_of_a_model_directory(tmp_path: Path) -> None:
    config = json.loads(write_config(tmp_path / "sft", "qwen3_vl").read_text())
    code, report = reader(tmp_path, "--path", str(tmp_path / "sft"))
    assert code == 0 and report.config is not None
    assert report.config == shape_fields(config)
    assert shape_from_config(report.config) == shape_from_config(config)
    # What does not size the model stays behind (rope settings, token ids, ...).
    assert "rope_parameters" not in report.config["text_config"]
    assert "image_token_id" not in report.config and len(json.dumps(report.config)) < 1024


def test_a_directory_without_config_json_is_the_models_error_naming_what_is_there(
        tmp_path: Path) -> None:
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / "model.safetensors").write_bytes(b"")
    code, report = reader(tmp_path, "--path", str(tmp_path / "sft"))
    assert code == 2 and not report.retry
    assert report.error == (f"{tmp_path}/sft/config.json does not exist ({tmp_path}/sft "
                            "holds: model.safetensors)")
    code, report = reader(tmp_path, "--path", str(tmp_path / "nope"))
    assert code == 2 and f"{tmp_path}/nope is not a directory" in str(report.error)
    (tmp_path / "sft" / "config.json").write_text("{not json")
    code, report = reader(tmp_path, "--path", str(tmp_path / "sft"))
    assert code == 2 and "config.json is not JSON" in str(report.error)


def hub_repo(root: Path, repo: str = "acme/custom-vl-3b") -> dict[str, object]:
    return dict(json.loads(write_config(root / "models" / repo, "qwen2_5_vl").read_text()))


def test_the_reader_gets_a_private_repo_with_the_token(tmp_path: Path) -> None:
    config = hub_repo(tmp_path)
    with stand_in_hub(tmp_path, token="hf_secret") as hub:
        url = hub_config_url(hub.url, "acme/custom-vl-3b", None)
        code, report = reader(tmp_path, "--url", url, token="hf_secret")
        assert code == 0 and report.config == shape_fields(config)
        code, report = reader(tmp_path, "--url", url)  # no token: the hub says 401
    assert code == 2 and not report.retry
    assert "HTTP 401" in str(report.error) and "spec.hub.tokenSecret" in str(report.error)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_an_unreachable_hub_is_worth_a_retry(tmp_path: Path) -> None:
    url = hub_config_url(f"http://127.0.0.1:{free_port()}", "acme/x", "v1")
    code, report = reader(tmp_path, "--url", url)
    assert code == 1 and report.retry
    assert str(report.error).startswith(f"GET {url}: ")


def test_the_operator_reads_a_public_repo_once_and_a_failure_briefly(tmp_path: Path) -> None:
    config = hub_repo(tmp_path)
    hub_config.forget()
    clock = [0.0]
    with stand_in_hub(tmp_path) as hub:
        url = hub_config_url(hub.url, "acme/custom-vl-3b", None)
        assert url == f"{hub.url}/acme/custom-vl-3b/resolve/main/config.json"
        first = hub_config.read(url, lambda: clock[0])
        again = hub_config.read(url, lambda: clock[0])
        assert first == again and first.config == shape_fields(config)
        assert hub.requests == ["GET /acme/custom-vl-3b/resolve/main/config.json"]
        missing = hub_config_url(hub.url, "acme/absent", "main")
        gone = hub_config.read(missing, lambda: clock[0])
        assert gone.config is None and not gone.retry and "HTTP 404" in str(gone.error)
        clock[0] += hub_config.FAILED_TTL_S + 1  # a failure is asked again soon
        hub_config.read(missing, lambda: clock[0])
        hub_config.read(url, lambda: clock[0])  # a success is kept longer
        assert hub.requests.count("GET /acme/absent/resolve/main/config.json") == 2
        assert len(hub.requests) == 3
    hub_config.forget()


def test_the_shared_directory_replaces_those_of_processes_that_are_gone(tmp_path: Path) -> None:
    """The admission process and the operator share config.json answers through a
    directory; an operator SIGKILLed (or a container restarted as the same PID) leaves
    its directory behind, and the next start removes it, never a live process's."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    prefix = hub_config.SHARED_PREFIX
    dead = tmp_path / f"{prefix}{gone.pid}-a1"
    mine = tmp_path / f"{prefix}{os.getpid()}-b2"  # an earlier process with this PID
    live = tmp_path / f"{prefix}{os.getppid()}-c3"
    other = tmp_path / "grpo-operator-hubris"
    for d in (dead, mine, live, other):
        d.mkdir()
        (d / "answer.json").write_text("{}")
    made = hub_config.shared_directory(tmp_path)
    assert made.is_dir() and made.name.startswith(f"{prefix}{os.getpid()}-")
    assert not dead.exists() and not mine.exists()
    assert live.exists() and other.exists()
