"""The main job, end to end, with the operator, KubeRay and the trainer all real: what
`make demo` runs (grpo_testbed/tiny_job.py), asserted on.

On the testbed's real node: the operator in the cluster from its image (`helm install`),
the tiny job as a CPU head pod (Ray and the driver) and a worker pod (both ranks) from the
trainer image, each in its own network namespace with its own address, the worker
finding the head through the head Service's DNS name. Attempt 0's ranks leak host memory
(the testbed's fault switch, with Ray's memory monitor off in that worker pod), so the
kernel OOM-kills the worker pod at its limit; the operator classifies it (HostOOM) and
remediates it (the host ladder), attempt 1 resumes from the last checkpoint, the job
succeeds and exports its model. One scenario (module fixture), several assertions on
what a user would look at.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import ATTEMPT_EVENTS, ROLE_LABEL, Role
from grpo_testbed.images import TRAINER_CPU
from grpo_testbed.node.runtime import NODE_NAME
from grpo_testbed.tiny_job import (
    JOB,
    JOB_NS,
    LEAK_STEP,
    TERMINAL,
    TinyJob,
    multipod_example,
    tiny_job_testbed,
    worker_oom,
)
from grpo_testkit.datasets import write_with_corrupt_image
from grpo_trainer.liveness.attempt_events import event_time

pytestmark = pytest.mark.e2e

RESUMED = re.compile(r"resumed from checkpoint step (\d+)")
BAD_ROW = 5
TOTAL = int(multipod_example()["spec"]["training"]["maxSteps"])
INTERVAL = int(multipod_example()["spec"]["checkpoint"]["intervalSteps"])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyJob]:
    with tiny_job_testbed(tmp_path_factory.mktemp("e2e"), worker_oom()) as tj:
        tj.install_chart()
        tj.build_assets()
        # One row's image is no image: with badRows skip the job trains on the others.
        write_with_corrupt_image(tj.data_file(), tj.data_file(), BAD_ROW)
        doc = multipod_example()
        doc["spec"]["data"]["badRows"] = "skip"
        tj.apply_job(doc)
        tj.watch(lambda j: j.get("status", {}).get("phase") in TERMINAL, 1500,
                 "the tiny job to finish")
        yield tj


def status(tj: TinyJob) -> dict[str, Any]:
    return dict(tj.job()["status"])


def step_metrics(log: str) -> list[dict[str, Any]]:
    """The trainer's per-step JSON lines from a head container's log."""
    out = []
    for line in log.splitlines():
        if line.startswith("{") and '"step"' in line:
            out.append(json.loads(line))
    return out


def test_job_succeeds_after_the_kernel_oom_kills_its_worker_pod_and_one_restart(
        tiny: TinyJob) -> None:
    st = status(tiny)
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    first, second = st["attempts"]
    ended = tiny.terminations(0)
    assert first["outcome"] == "HostOOM", (first, ended)
    assert "worker pod" in first["reason"] and "OOMKilled" in first["reason"], first
    assert first["remediation"], "the operator applied no step of the HostOOM ladder"
    # The progress the trainer reported right after its last checkpoint (interval 2).
    ckpt = first["lastCheckpointStep"]
    assert ckpt is not None and ckpt >= LEAK_STEP and ckpt % INTERVAL == 0, first
    assert second["outcome"] == "Succeeded"
    assert st["restarts"] == 1
    # What `kubectl get pods` showed: the kernel killed the worker pod at its limit; the
    # head (whose memory never grew) ended after it, its ranks gone.
    killed = [e for e in ended if (e.reason, e.exit_code) == ("OOMKilled", 137)]
    assert [e.role for e in killed] == [Role.WORKER], ended


def test_the_oom_killed_attempts_logs_outlived_its_pods_on_the_claim(tiny: TinyJob) -> None:
    """Attempt 0's head and worker pods are gone; what each printed is on the checkpoint
    claim where status.attempts[0].logs says: the driver's step lines (its ranks' too, sent
    by Ray) as the node's own log archive has them, and the killed worker pod's file."""
    kept = tiny.kept_logs(0)
    head = [k for k in kept if k.startswith(f"{tiny.name}-a0-head")]
    workers = {p["metadata"]["name"] for p in tiny.pods(0, Role.WORKER)}
    assert len(head) == 1 and workers and workers <= set(kept), sorted(kept)
    archived = tiny.head_log(0)
    kept_steps = [m["step"] for m in step_metrics(kept[head[0]])]
    assert kept_steps and kept_steps == [m["step"] for m in step_metrics(archived)]
    ranks = re.compile(r"^\(\w+ pid=\d+.*$", re.M)  # a line Ray sent from a rank actor
    assert set(ranks.findall(archived)) <= set(ranks.findall(kept[head[0]]))


def test_the_oom_killed_attempts_events_outlived_it_on_the_claim(tiny: TinyJob) -> None:
    """Beside attempt 0's logs, its events (the API server drops them within the hour):
    every event the API server holds of attempt 0's RayCluster and pods, and of the job
    while attempt 0 ran, as of the file's last write, one line each."""
    path = tiny.kept_dir(0) / ATTEMPT_EVENTS
    kept = {" ".join(line.split()[2:4]).rstrip(":") for line in path.read_text().splitlines()}
    written = datetime.fromtimestamp(path.stat().st_mtime, UTC) - timedelta(seconds=2)
    first, second = status(tiny)["attempts"]
    start, end = (datetime.fromisoformat(a["startTime"]).replace(microsecond=0)
                  for a in (first, second))
    cluster = f"{tiny.name}-a0"
    expected = set()
    for e in tiny.events():
        obj, when = e["involvedObject"], event_time(e)
        ours = ((obj["kind"], obj["name"]) == ("RayCluster", cluster)
                or (obj["kind"] == "Pod" and obj["name"].startswith(f"{cluster}-"))
                or ((obj["kind"], obj["name"]) == ("GRPOJob", tiny.name)
                    and when is not None and start <= when < end))
        if ours and when is not None and when < written:
            expected.add(f"{e['reason']} {obj['kind']}/{obj['name']}")
    assert expected <= kept, sorted(expected - kept)
    assert any(x.endswith(f"GRPOJob/{tiny.name}") for x in kept), sorted(kept)  # Planned
    assert any(f"Pod/{cluster}-" in x for x in kept), sorted(kept)  # e.g. Scheduled


def test_head_and_worker_ran_as_pods_with_their_own_addresses(tiny: TinyJob) -> None:
    net = tiny.tb.net
    assert net is not None
    for attempt in (0, 1):
        pods = [p for p in tiny.pods(attempt) if p.get("status", {}).get("podIP")]
        assert {p["metadata"]["labels"][ROLE_LABEL] for p in pods} == {"head", "worker"}
        ips = {p["status"]["podIP"] for p in pods}
        assert len(ips) == len(pods), [p["metadata"]["name"] for p in pods]
        assert all(ipaddress.ip_address(ip) in ipaddress.ip_network(net.pod_cidr)
                   for ip in ips)
        assert all(p["spec"]["nodeName"] == NODE_NAME for p in pods)
        assert all(c["image"] == TRAINER_CPU.tag for p in pods for c in p["spec"]["containers"])


# Each planned setting: where status.plan reports it and where the trainer's config holds
# it (written out here, not taken from the operator's code, so a setting the operator
# drops or renames fails the test). The config is its one channel: no env var carries it.
PLANNED = {
    "microBatchSize": ("actor", "micro_batch_size"),
    "microBatchTokens": ("actor", "micro_batch_tokens"),
    "gradientCheckpointing": ("actor", "gradient_checkpointing"),
    "offloadParams": ("actor", "offload_params"),
    "offloadOptimizer": ("actor", "offload_optimizer"),
    "rank0Init": ("actor", "init_strategy"),
    "rolloutN": ("rollout", "n"),
    "rolloutTensorParallel": ("rollout", "tensor_parallel_size"),
}
# The GRPO_* variables a Ray container may hold: the job's identity and per-process
# switches. Any other (GRPO_MICRO_BATCH_SIZE, say) would be a second channel.
PER_PROCESS = {"GRPO_JOB_NAME", "GRPO_JOB_NAMESPACE", "GRPO_JOB_UID", "GRPO_ATTEMPT",
               "GRPO_CHECKPOINT_DIR", "GRPO_FAULT_INJECT", "GRPO_TERMINATION_LOG"}


def _as_config(key: str, value: Any) -> Any:
    if key == "microBatchTokens":  # 0: micro-batches by samples, the trainer's None
        return value or None
    return ("rank0" if value else "sharded") if key == "rank0Init" else value


def _env(pod: dict[str, Any]) -> dict[str, str]:
    """The plain-valued env of a pod's Ray container, as the API server stored it."""
    return {e["name"]: e["value"] for e in pod["spec"]["containers"][0].get("env") or []
            if "value" in e}


def test_the_trainer_ran_with_the_settings_the_status_reports(tiny: TinyJob) -> None:
    st = status(tiny)
    plan = st["plan"]  # attempt 1's plan, as the operator reported it to the user
    resolved = yaml.safe_load((tiny.checkpoint_dir() / f"step-{TOTAL}" / "config.yaml")
                              .read_text())
    configs = {}
    for attempt in (0, 1):
        cm = json.loads(tiny.tb.kubectl("get", "configmap", f"{JOB}-config-{attempt}", "-n",
                                        JOB_NS, "-o", "json").stdout)
        configs[attempt] = yaml.safe_load(cm["data"]["config.yaml"])
        pods = tiny.pods(attempt)
        assert {p["metadata"]["labels"][ROLE_LABEL] for p in pods} == {"head", "worker"}
        for pod in pods:
            extra = sorted(n for n in _env(pod) if n.startswith("GRPO_") and n not in PER_PROCESS)
            assert not extra, f"attempt {attempt}: planned settings in the env: {extra}"
    for key, (section, field) in PLANNED.items():
        want = _as_config(key, plan[key])
        assert configs[1][section][field] == want, f"ConfigMap {key}: {configs[1][section]}"
        assert resolved[section][field] == want, f"the trainer ran {key}={resolved[section]}"
    assert resolved["resources"]["num_workers"] == plan["totalGpus"] == 2


def test_progress_reached_the_status_while_training(tiny: TinyJob) -> None:
    running = [j["status"]["progress"] for j in tiny.seen
               if j.get("status", {}).get("phase") == "Running"
               and (j["status"].get("progress") or {}).get("step")]
    assert running, "no progress was ever reported while the job ran"
    assert all(p.get("rewardMean") is not None and p.get("totalSteps") == TOTAL
               for p in running)
    final = status(tiny)["progress"]
    assert final["step"] == TOTAL and final["lastCheckpointStep"] == TOTAL


def test_the_row_with_a_corrupt_image_was_skipped_named_and_counted(tiny: TinyJob) -> None:
    """spec.data.badRows: skip: every attempt leaves the row out at load, the log names
    it, status.progress and every step's metrics count it."""
    train = multipod_example()["spec"]["data"]["train"]
    assert status(tiny)["progress"]["badRows"] == 1
    for attempt in (0, 1):
        log = tiny.head_log(attempt)
        assert (f"skipped 1 of 32 prompts of data.train_files (data.bad_rows "
                f"(spec.data.badRows): skip): {train} row {BAD_ROW}: image 1 is not an image "
                "that can be read") in log
        assert {m["data/bad_rows"] for m in step_metrics(log)} == {1.0}


def test_attempt_1_starts_at_the_checkpoint_step_plus_one(tiny: TinyJob) -> None:
    log1 = tiny.head_log(1)
    found = RESUMED.search(log1)
    assert found, "attempt 1 did not resume from a checkpoint"
    ckpt = int(found.group(1))
    assert ckpt == status(tiny)["attempts"][0]["lastCheckpointStep"], ckpt
    steps0 = [m["step"] for m in step_metrics(tiny.head_log(0))]
    steps1 = [m["step"] for m in step_metrics(log1)]
    assert steps0 == list(range(1, len(steps0) + 1)) and len(steps0) >= ckpt, steps0
    assert steps1 == list(range(ckpt + 1, TOTAL + 1)), steps1


def test_the_exported_model_equals_an_uninterrupted_local_run(tiny: TinyJob,
                                                              tmp_path: Path) -> None:
    """The model status.export names, trained through an OOM kill and a resume, is bit for
    bit the model of the same config run here without interruption."""
    import torch
    from safetensors.torch import load_file

    cm = json.loads(tiny.tb.kubectl("get", "configmap", f"{JOB}-config-1", "-n", JOB_NS,
                                    "-o", "json").stdout)
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    cfg["model"]["path"] = str(tiny.model_dir())
    cfg["data"]["train_files"] = [str(tiny.data_file())]
    cfg["checkpoint"]["dir"] = str(tmp_path / "ckpt")
    cfg["resources"]["ray_address"] = "local"
    # The same layout (one node of 2 ranks) on the one local Ray node, which is the head.
    cfg["resources"]["ranks_on_head"] = True
    cfg["metrics"]["prometheus_port"] = None
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (worker,) = tiny.pods(1, Role.WORKER)  # where the ranks ran
    env = {**os.environ, **{k: v for k, v in _env(worker).items()
                            if k.startswith(("GRPO_", "OMP_", "TOKENIZERS_"))
                            and k not in ("GRPO_CHECKPOINT_DIR", "GRPO_FAULT_INJECT")}}
    run = subprocess.run([sys.executable, "-m", "grpo_trainer", "--config",
                          str(tmp_path / "config.yaml"), "--no-resume"],
                         env=env, capture_output=True, text=True, timeout=900, check=False)
    assert run.returncode == 0, run.stderr[-3000:]

    local = tmp_path / "local-export"
    subprocess.run([sys.executable, "-m", "grpo_trainer", "export", "--checkpoint-dir",
                    str(tmp_path / "ckpt"), "--out", str(local)], check=True,
                   capture_output=True)
    exported = tiny.exported_dir()
    assert tiny.job()["status"]["export"]["step"] == TOTAL
    a = load_file(str(local / "model.safetensors"))
    b = load_file(str(exported / "model.safetensors"))
    assert a.keys() == b.keys()
    differ = [k for k in a if not torch.equal(a[k], b[k])]
    assert not differ, f"{len(differ)} tensors differ, e.g. {differ[:3]}"
