"""Hub models and datasets: fetched once onto the job's volume by the head's init
container, resumed after a crash, reused by later attempts, progress and failure in
status; the trainer then reads only local files, EasyR1-layout datasets included.

The hub is a STAND-IN (grpo_testkit.hub: the hub's file API served from a local
directory on loopback); the client, the files on disk and the loading are real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.job.status import GRPOJobStatus
from grpo_api.trainer_config import DataConfig
from grpo_operator.reconcile import read_status
from grpo_operator.reconcile.attempts import ensure_attempt as reconcile
from grpo_operator.reconcile.classify import classify_pod
from grpo_operator.reconcile.conditions import hub_fetch_conditions
from grpo_operator.reconcile.planning import Planner
from grpo_operator.reconcile.stored import wire
from grpo_operator.render import JobRef
from grpo_testkit.datasets import write_vision_task
from grpo_testkit.hub import stand_in_hub
from grpo_trainer.config import build_config, check_runtime
from grpo_trainer.dataset import PromptDataset
from grpo_trainer.hub_fetch import MARKER, main

pytestmark = pytest.mark.unit


def model_repo(root: Path, size: int = 3 * 2**20) -> Path:
    repo = root / "models" / "acme" / "tiny-vl"
    repo.mkdir(parents=True)
    (repo / "config.json").write_text('{"model_type": "qwen2_5_vl"}')
    (repo / "model.safetensors").write_bytes(os.urandom(size))
    return repo


def fetch_cli(root: Path, url: str, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "HF_ENDPOINT": url, "HF_HUB_DISABLE_XET": "1"}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.Popen([sys.executable, "-m", "grpo_trainer.hub_fetch", "--root",
                             str(root), *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def _size(path: Path) -> int:
    """A part file's size; 0 once the fetch has renamed it (listed, then gone)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def test_a_killed_fetch_resumes_and_a_later_attempt_fetches_nothing(tmp_path: Path) -> None:
    source = model_repo(tmp_path / "hub", size=8 * 2**20)
    volume = tmp_path / "volume"
    dest = volume / "models" / "acme" / "tiny-vl"
    with stand_in_hub(tmp_path / "hub", delay_s=0.01) as hub:
        first = fetch_cli(volume, hub.url, "--model", "acme/tiny-vl")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not any(
                _size(p) > 2**20 for p in dest.rglob("*.part")):
            time.sleep(0.02)
        first.send_signal(signal.SIGKILL)  # the pod dies mid-file
        first.wait()
        assert not (dest / MARKER).exists()
        hub.delay_s = 0.0
        second = fetch_cli(volume, hub.url, "--model", "acme/tiny-vl")
        assert second.wait(60) == 0, second.stdout.read() if second.stdout else ""
        resumed = [r for r in hub.requests if "model.safetensors" in r and " bytes=" in r]
        assert resumed and int(resumed[-1].rsplit("bytes=", 1)[1].rstrip("-")) > 2**20, (
            "\n".join(hub.requests))
        assert (dest / "model.safetensors").read_bytes() == (
            source / "model.safetensors").read_bytes()
        before = len(hub.requests)
        third = fetch_cli(volume, hub.url, "--model", "acme/tiny-vl")  # the next attempt
        assert third.wait(60) == 0
        assert len(hub.requests) == before  # found on the volume: no hub request at all


def test_a_failed_fetch_exits_1_naming_the_repo(tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "hub").mkdir()
    with stand_in_hub(tmp_path / "hub") as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        try:
            code = main(["--root", str(tmp_path / "v"), "--model", "acme/missing"])
        finally:
            del os.environ["HF_ENDPOINT"]
    assert code == 1
    assert "model acme/missing" in caplog.text and "404" in caplog.text


def test_an_easyr1_layout_hub_dataset_loads_from_the_volume(tmp_path: Path) -> None:
    repo = tmp_path / "hub" / "datasets" / "hiyouga" / "geometry3k" / "data"
    repo.mkdir(parents=True)
    write_vision_task(repo / "train-00000-of-00001.parquet", rows=6)
    write_vision_task(repo / "test-00000-of-00001.parquet", rows=2)
    with stand_in_hub(tmp_path / "hub") as hub:
        os.environ["HF_ENDPOINT"] = hub.url
        try:
            assert main(["--root", str(tmp_path / "v"), "--dataset", "hiyouga/geometry3k"]) == 0
        finally:
            del os.environ["HF_ENDPOINT"]
    local = tmp_path / "v" / "datasets" / "hiyouga" / "geometry3k"
    cfg = DataConfig.model_validate({"train_files": [f"{local}@train"]})
    train = PromptDataset([f"{local}@train"], cfg)
    assert len(train) == 6 and len(PromptDataset([f"{local}@test"], cfg)) == 2
    assert train.records[0].images[0].startswith(b"\x89PNG")  # image bytes, as on the hub
    check_runtime(build_config({"model": {"path": str(tmp_path)}, "data": {"train_files": [
        f"{local}@train"]}}, environ={}))  # the trainer's own check accepts <dir>@<split>


SPEC: dict[str, Any] = {
    "model": {"path": "Qwen/Qwen2.5-VL-7B-Instruct", "revision": "main"},
    "data": {"train": "hiyouga/geometry3k@train", "val": "hiyouga/geometry3k@test"},
    "resources": {"gpuType": "H100-80GB", "nodes": 1},
    "checkpoint": {"size": "100Gi"},
    "hub": {"tokenSecret": "hf-token", "endpoint": "https://hf-mirror.example"},
}


def test_the_head_fetches_before_ray_starts_and_the_trainer_gets_local_paths() -> None:
    d = reconcile(JobRef("geo", "ns", "u"), Planner(SPEC).plan([], None), GRPOJobStatus(),
                  "2026-01-01T00:00:00Z", "img")
    rc = next(c for c in d.children if c["kind"] == "RayCluster")["spec"]
    (init,) = rc["headGroupSpec"]["template"]["spec"]["initContainers"]
    assert init["command"] == [
        "python", "-m", "grpo_trainer.hub_fetch", "--root", "/checkpoints/ns/geo/hub",
        "--model", "Qwen/Qwen2.5-VL-7B-Instruct@main",
        "--dataset", "hiyouga/geometry3k", "--dataset", "hiyouga/geometry3k"]
    env = {e["name"]: e for e in init["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    assert env["HF_ENDPOINT"]["value"] == "https://hf-mirror.example"
    assert {"name": "checkpoints", "mountPath": "/checkpoints"} in init["volumeMounts"]
    assert "initContainers" not in rc["workerGroupSpecs"][0]["template"]["spec"]
    config = yaml.safe_load(next(c for c in d.children if c["kind"] == "ConfigMap")[
        "data"]["config.yaml"])
    assert config["model"]["path"] == "/checkpoints/ns/geo/hub/models/Qwen/Qwen2.5-VL-7B-Instruct"
    assert config["data"]["train_files"] == [
        "/checkpoints/ns/geo/hub/datasets/hiyouga/geometry3k@train"]
    assert config["data"]["val_files"] == [
        "/checkpoints/ns/geo/hub/datasets/hiyouga/geometry3k@test"]


def test_paths_on_volumes_are_never_fetched() -> None:
    local = dict(SPEC, model={"path": "Qwen/Qwen2.5-VL-7B-Instruct", "claimName": "models"},
                 data={"train": "/models/geo/train.parquet"})
    d = reconcile(JobRef("geo", "ns", "u"), Planner(local).plan([], None), GRPOJobStatus(),
                  "2026-01-01T00:00:00Z", "img")
    rc = next(c for c in d.children if c["kind"] == "RayCluster")["spec"]
    assert "initContainers" not in rc["headGroupSpec"]["template"]["spec"]


def fetch_report(progress: dict[str, Any], conditions: list[dict[str, Any]],
                 now: str) -> list[dict[str, Any]] | None:
    """hub_fetch_conditions on the status as stored, its answer as written."""
    status = read_status({"progress": progress, "conditions": conditions}).status
    new = hub_fetch_conditions(status.progress, status.conditions, 1, now)
    return None if new is None else wire(new)  # type: ignore[no-any-return]


def test_progress_and_failure_are_the_hubfetch_condition() -> None:
    now = "2026-01-01T00:00:00Z"
    fetching = {"fetch": {"repo": "acme/m", "file": "model.safetensors",
                          "bytesDone": 2**30, "bytesTotal": 4 * 2**30, "state": "Fetching"}}
    (cond,) = fetch_report(fetching, [], now) or []
    assert (cond["type"], cond["status"], cond["reason"]) == ("HubFetch", "False", "Fetching")
    assert cond["message"] == "acme/m: 1.00 of 4.00 GiB, now model.safetensors"
    failed = {"fetch": {"repo": "acme/m", "state": "Failed", "message": "model acme/m: 401"}}
    (cond,) = fetch_report(failed, [cond], now) or []
    assert (cond["reason"], cond["message"]) == ("FetchFailed", "model acme/m: 401")
    assert fetch_report(failed, [cond], now) is None  # unchanged: no write


def test_a_failed_fetch_ends_the_attempt_with_its_message() -> None:
    pod = {"status": {"phase": "Failed", "initContainerStatuses": [{
        "name": "hub-fetch", "state": {"terminated": {
            "exitCode": 1, "message": "model acme/m: 401 Unauthorized"}}}],
        "containerStatuses": [{"name": "ray-head", "state": {"waiting": {
            "reason": "PodInitializing"}}}]}}
    outcome = classify_pod(pod)
    assert outcome is not None and outcome.reason.value == "Error"
    assert "init container hub-fetch failed (exit 1): model acme/m: 401" in outcome.message
