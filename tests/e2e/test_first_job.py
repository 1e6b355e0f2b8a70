"""The first job, exactly as docs/deployment.md and the chart's NOTES tell a new user:
`helm install` the chart (the operator in-cluster from its image, its webhook on), then
`kubectl apply -f examples/grpojob-first.yaml` unchanged. Nothing is prepared for it: the
operator creates its claim from the default StorageClass, the head pod's init container
builds the tiny model and data onto it from the trainer image, and the job trains on the
real node's CPU until it is Succeeded. The only value set beyond the chart's defaults is
which images to run: the ones built here, not the registry's."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import JOB_LABEL, TERMINAL_PHASES
from grpo_testbed.images import OPERATOR, TRAINER_CPU
from grpo_testbed.launcher import Testbed, running_testbed
from grpo_testbed.tiny_job import CHART, REPO

pytestmark = pytest.mark.e2e

EXAMPLE = REPO / "examples" / "grpojob-first.yaml"
MANIFEST = yaml.safe_load(EXAMPLE.read_text())
JOB = MANIFEST["metadata"]["name"]
REPOSITORY, TAG = OPERATOR.tag.rsplit(":", 1)
TERMINAL = tuple(p.value for p in TERMINAL_PHASES)


@dataclass
class Run:
    tb: Testbed
    ns: str
    job: dict[str, Any]
    seconds: float
    pods: list[dict[str, Any]] = field(default_factory=list)  # every job pod state seen
    notes: str = ""  # what `helm install` printed (NOTES.txt)
    probe: dict[str, Any] = field(default_factory=dict)  # PROBE's answer from the head pod
    operators: list[dict[str, Any]] = field(default_factory=list)  # after `helm --wait`

    def claim_dir(self) -> Path:
        assert self.tb.node is not None and self.tb.node.claims is not None
        return self.tb.node.claims.wait_path(self.ns, f"{JOB}-checkpoints")


# Run inside the head pod with its own ServiceAccount token, as a job's reward code
# could: forge the phase, then re-send the job's own progress. Then Ray's dashboard (its
# Jobs API) without and with the cluster's token, and the probes' health endpoint.
# Prints the HTTP codes.
PROBE = """
import json, os, sys, urllib.error, urllib.request
from kubernetes import client, config
def get(port, path, token=None):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        req.add_header("Authorization", "Bearer " + token)
    try:
        return urllib.request.urlopen(req, timeout=10).status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError as e:
        return str(e)
config.load_incluster_config()
api = client.CustomObjectsApi()
ns = open("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read()
args = ("grpo.dev", "v1alpha1", ns, "grpojobs", sys.argv[1])
def patch(body):
    try:
        api.patch_namespaced_custom_object_status(*args, body)
        return 200, ""
    except client.ApiException as e:
        return e.status, e.body
phase = patch({"status": {"phase": "Succeeded"}})
progress = (api.get_namespaced_custom_object_status(*args).get("status") or {}).get("progress")
report = patch({"status": {"progress": progress}})
token = os.environ.get("RAY_AUTH_TOKEN")
ray = {"anonymous": get(8265, "/api/jobs/"), "token": get(8265, "/api/jobs/", token),
       "agent": get(52365, "/api/job_agent/jobs/nope"), "health": get(52365, "/api/healthz")}
print(json.dumps({"phase": phase, "progress": report, "ray": ray}))
"""


def probe_from_head(tb: Testbed, ns: str, pod: str) -> dict[str, Any]:
    out = tb.kubectl("exec", pod, "-n", ns, "-c", "ray-head", "--", "python", "-c",
                     PROBE, JOB).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


@pytest.fixture(scope="module")
def run() -> Iterator[Run]:
    with running_testbed(real_node=True, node_images=(OPERATOR.tag, TRAINER_CPU.tag)) as tb:
        system = tb.namespace("grpo-system")
        notes = tb.helm(
            "install", "grpo", str(CHART), "-n", system,
            "--set", f"image.repository={REPOSITORY}", "--set", f"image.tag={TAG}",
            "--set", "image.pullPolicy=Never", "--set", f"trainerImage={TRAINER_CPU.tag}",
            "--wait", "--timeout", "240s").stdout  # the chart's defaults: 2 replicas, peering
        operators = json.loads(tb.kubectl(
            "get", "pods", "-n", system, "-l", "app.kubernetes.io/instance=grpo",
            "-o", "json").stdout)["items"]
        ns = tb.namespace("team")
        t0 = time.monotonic()
        tb.kubectl("apply", "-n", ns, "-f", str(EXAMPLE))
        pods: list[dict[str, Any]] = []
        probe: dict[str, Any] = {}
        deadline = t0 + 900
        while True:
            job = json.loads(tb.kubectl("get", "grpojob", JOB, "-n", ns, "-o", "json").stdout)
            now = json.loads(tb.kubectl("get", "pods", "-n", ns, "-l", f"{JOB_LABEL}={JOB}",
                                        "-o", "json").stdout)["items"]
            pods += now
            head = [p["metadata"]["name"] for p in now if "running" in (
                {c["name"]: c["state"] for c in p["status"].get("containerStatuses") or []}
                .get("ray-head") or {})]
            # Once the trainer has reported: its progress is then whole and valid.
            if head and not probe and job.get("status", {}).get("progress"):
                probe = probe_from_head(tb, ns, head[0])
            if job.get("status", {}).get("phase") in TERMINAL:
                break
            assert time.monotonic() < deadline, json.dumps(job.get("status"), indent=1)
            time.sleep(2)
        yield Run(tb, ns, job, time.monotonic() - t0, pods, notes=notes, operators=operators,
                  probe=probe)
        tb.kubectl("delete", "grpojob", JOB, "-n", ns, "--wait=true", "--timeout=60s",
                   check=False)
        tb.helm("uninstall", "grpo", "-n", system, "--wait", "--timeout", "120s", check=False)


def test_the_first_example_succeeds_on_its_first_attempt(run: Run) -> None:
    status = run.job["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    assert status["restarts"] == 0 and len(status["attempts"]) == 1, status["attempts"]
    steps = MANIFEST["spec"]["training"]["maxSteps"]
    assert status["progress"]["step"] == status["progress"]["totalSteps"] == steps
    print(f"first job: Succeeded in {run.seconds:.0f} s after kubectl apply")


def test_the_jobs_own_token_reports_progress_but_cannot_forge_its_phase(run: Run) -> None:
    """From the running head pod, with the token mounted there: the chart's policy
    refuses a phase patch (403, naming the one field allowed), takes a progress patch,
    and the job still ends on its own (Succeeded above, one attempt)."""
    assert run.probe, "the head pod was never seen running after a progress report"
    code, body = run.probe["phase"]
    assert code == 403 and "may change only status.progress" in body, run.probe
    assert run.probe["progress"] == [200, ""], run.probe


def test_the_ray_dashboard_and_jobs_api_ask_for_the_clusters_token(run: Run) -> None:
    """Ray's token authentication, which every RayCluster asks KubeRay for: without the
    token the head's Jobs API answers 401 and so does its node agent (which takes job
    submissions too); with the token KubeRay put in the Ray container it answers; the
    health endpoint the probes use stays open (the job ran, Ready, to Succeeded)."""
    assert run.probe, "the head pod was never seen running after a progress report"
    ray = run.probe["ray"]
    assert ray == {"anonymous": 401, "token": 200, "agent": 401, "health": 200}, ray


def test_the_default_install_runs_two_ready_operator_replicas(run: Run) -> None:
    # One reconciles (the job above Succeeded once), the other stands by and stays Ready.
    ready = [p["metadata"]["name"] for p in run.operators
             if any(c["type"] == "Ready" and c["status"] == "True"
                    for c in p["status"].get("conditions") or [])]
    assert len(ready) == 2, [p["status"] for p in run.operators]


def test_its_init_container_built_the_model_on_the_claim_the_operator_made(run: Run) -> None:
    inits = [s for p in run.pods for s in p.get("status", {}).get("initContainerStatuses") or []
             if s["name"] == "make-tiny"]
    ended = [s["state"]["terminated"] for s in inits if "terminated" in s.get("state", {})]
    assert ended and all(t["exitCode"] == 0 for t in ended), inits
    assert all(p["spec"]["initContainers"][0]["image"] == TRAINER_CPU.tag for p in run.pods)
    pvc = json.loads(run.tb.kubectl("get", "pvc", f"{JOB}-checkpoints", "-n", run.ns, "-o",
                                    "json").stdout)
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    root = run.claim_dir()
    assert (root / "tiny" / "model" / "config.json").exists()
    assert (root / "tiny" / "train.parquet").exists()


def test_checkpoints_and_tensorboard_events_are_beside_each_other_on_the_claim(
        run: Run) -> None:
    home = run.claim_dir() / run.ns / JOB
    steps = sorted(int(p.name.split("-")[-1]) for p in home.glob("step-*"))
    assert steps and steps[-1] == MANIFEST["spec"]["training"]["maxSteps"], steps
    assert list((home / "tensorboard").glob("events.out.tfevents.*"))


def test_helm_install_tells_the_user_to_apply_this_example(run: Run) -> None:
    assert f"-f examples/{EXAMPLE.name}" in run.notes, run.notes
    assert f"grpo plan examples/{EXAMPLE.name}" in run.notes, run.notes


def test_the_trained_model_is_exported_to_the_claim_where_status_says(run: Run) -> None:
    export = run.job["status"]["export"]
    assert export["claimName"] == f"{JOB}-checkpoints"
    assert export["step"] == MANIFEST["spec"]["training"]["maxSteps"]
    out = run.claim_dir() / export["path"]
    assert (out / "config.json").exists() and list(out.glob("*.safetensors")), \
        sorted(p.name for p in out.iterdir())
