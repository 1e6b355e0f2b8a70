"""The operator reconciles GRPOJobs into real KubeRay clusters on the testbed."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import RANK0_GROUP
from grpo_testbed.chaos import end_pod
from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed
from grpo_testbed.operator_process import OperatorProcess
from grpo_testbed.processes import wait_until
from grpo_trainer.liveness.progress import Progress

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def apply(tb: Testbed, ns: str, doc: dict[str, Any], check: bool = True) -> Any:
    return tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=check)


def job(tb: Testbed, ns: str, name: str) -> dict[str, Any]:
    return json.loads(tb.kubectl("get", "grpojob", name, "-n", ns, "-o", "json").stdout)


def phase(tb: Testbed, ns: str, name: str) -> str:
    return str(job(tb, ns, name).get("status", {}).get("phase", ""))


def wait_phase(tb: Testbed, op: OperatorProcess, ns: str, name: str, want: str,
               timeout: float = 90) -> dict[str, Any]:
    try:
        wait_until(f"{name} {want}", lambda: phase(tb, ns, name) == want, timeout)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}\nstatus: {job(tb, ns, name).get('status')}\n"
                             f"operator log:\n{op.log_tail()}") from None
    return job(tb, ns, name)


def items(tb: Testbed, kind: str, ns: str, selector: str = "") -> list[dict[str, Any]]:
    args = ["get", kind, "-n", ns, "-o", "json"] + (["-l", selector] if selector else [])
    return list(json.loads(tb.kubectl(*args).stdout)["items"])


def head_pod(tb: Testbed, ns: str, job_name: str) -> dict[str, Any]:
    pods = items(tb, "pods", ns, f"grpo.dev/job={job_name},grpo.dev/role=head")
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def end_head(tb: Testbed, ns: str, job_name: str, exit_code: int, reason: str,
             message: str = "") -> None:
    """Play the trainer exiting, as the kubelet would report it (kwok chaos stage)."""
    end_pod(tb.kubectl, ns, head_pod(tb, ns, job_name)["metadata"]["name"], exit_code,
            reason, message)


def test_tiny_job_gets_children_owned_by_it_and_runs(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "tiny"))
    status = wait_phase(testbed, operator, op_ns, "tiny", "Running")["status"]
    uid = job(testbed, op_ns, "tiny")["metadata"]["uid"]
    for kind in ("configmap", "serviceaccount", "role", "rolebinding", "raycluster"):
        owned = [i for i in items(testbed, kind, op_ns, "grpo.dev/job=tiny")
                 if any(o["uid"] == uid for o in i["metadata"].get("ownerReferences", []))]
        assert len(owned) == 1, kind
    # The checkpoint claim is kept (checkpoint.retention Retain): labelled, not owned.
    claim = items(testbed, "persistentvolumeclaim", op_ns, f"grpo.dev/job-uid={uid}")
    assert len(claim) == 1 and "ownerReferences" not in claim[0]["metadata"]
    assert status["rayCluster"]["name"] == "tiny-a0"
    assert status["plan"]["totalGpus"] == 2
    cond = {c["type"]: c for c in status["conditions"]}
    assert cond["Ready"]["status"] == "True"
    assert cond["Ready"]["observedGeneration"] == job(testbed, op_ns, "tiny")["metadata"][
        "generation"]
    # The head runs Ray's head and then the trainer, with the job's identity and Ray's
    # settings as env; the planned settings are in the trainer's config only, and the
    # identity in the env only.
    head = head_pod(testbed, op_ns, "tiny")["spec"]["containers"][0]
    assert "grpo_trainer --config /etc/grpo/config.yaml" in head["args"][0]
    env = {e["name"]: e.get("value") for e in head["env"]}
    assert "GRPO_GRADIENT_CHECKPOINTING" not in env
    assert env["GRPO_CHECKPOINT_DIR"] == f"/checkpoints/{op_ns}/tiny"
    assert env["RAY_memory_usage_threshold"] == "0.95"
    mounts = {m["mountPath"] for m in head["volumeMounts"]}
    assert {"/checkpoints", "/etc/grpo", "/dev/shm"} <= mounts
    cm = items(testbed, "configmap", op_ns, "grpo.dev/job=tiny")[0]
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    assert "dir" not in cfg["checkpoint"] and "job_name" not in cfg["trainer"]
    assert cfg["resources"]["num_workers"] == 2
    assert isinstance(cfg["actor"]["gradient_checkpointing"], bool)


def test_gpu_job_lands_on_its_gpu_type_with_tolerations(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    # Two nodes: rank 0's (it alone reads the whole model) is a worker group of its own.
    apply(testbed, op_ns, example_job("grpojob-qwen25vl-7b-a100-40gb.yaml", "a100",
                                      resources={"gpuType": "A100-40GB", "nodes": 2}))
    wait_phase(testbed, operator, op_ns, "a100", "Running")
    workers = items(testbed, "pods", op_ns, "grpo.dev/job=a100,grpo.dev/role=worker")
    assert len(workers) == 2
    assert sorted(w["spec"]["nodeName"] for w in workers) == ["a100-40gb-0", "a100-40gb-1"]
    limits = workers[0]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "8"
    plan = job(testbed, op_ns, "a100")["status"]["plan"]
    memory = {w["metadata"]["labels"]["ray.io/group"]:
              w["spec"]["containers"][0]["resources"]["limits"]["memory"] for w in workers}
    assert set(memory) == {RANK0_GROUP, "workers"}, memory
    assert int(memory[RANK0_GROUP].removesuffix("Gi")) >= plan["peakHostGiB"]
    assert int(memory["workers"].removesuffix("Gi")) < plan["peakHostGiB"]
    assert any("rank0Pod=1 x (8 GPU" in d for d in plan["details"]["decisions"])
    # Sized for the testbed's A100 Nodes as they are (760 GiB), not the catalog's 1152.
    assert plan["nodeSource"] == ("2 Node(s) labelled nvidia.com/gpu.product=NVIDIA-A100-"
                                  "SXM4-40GB; the smallest allocates 760.0 GiB and 96 CPUs")
    # KubeRay keeps the head's num-cpus/num-gpus 0 in the `ray start` it generates (else
    # it derives them from the limits, as for the workers): no rank lands on the head.
    def ray_start(pod: dict[str, Any]) -> str:
        env = {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0]["env"]}
        return env["KUBERAY_GEN_RAY_START_CMD"]

    head_cmd, worker_cmd = ray_start(head_pod(testbed, op_ns, "a100")), ray_start(workers[0])
    assert "--num-cpus=0" in head_cmd and "--num-gpus=0" in head_cmd, head_cmd
    assert "--num-gpus=8" in worker_cmd and "--num-cpus=0" not in worker_cmd, worker_cmd
    # A head and a worker on different nodes share the operator's claim.
    claim = items(testbed, "persistentvolumeclaim", op_ns, "grpo.dev/job=a100")[0]
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    out = testbed.kubectl("get", "grpojobs", "-n", op_ns).stdout
    assert "Running" in out.splitlines()[1] and " 16 " in out.splitlines()[1]


def test_four_4_gpu_jobs_share_the_two_8_gpu_h100_nodes(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    """A worker asks for its share of the node (4 of 8 GPUs: at most half its CPUs and
    memory), so four 4-GPU jobs run at once on the testbed's two 8-GPU H100 nodes (a
    worker that asked for 90% of a node's CPUs left two of them Pending)."""
    jobs = [f"share{i}" for i in range(4)]
    for name in jobs:
        apply(testbed, op_ns, example_job("grpojob-qwen25vl-7b-h100.yaml", name,
                                          resources={"gpuType": "H100-80GB", "nodes": 1,
                                                     "gpusPerNode": 4}))
    for name in jobs:
        wait_phase(testbed, operator, op_ns, name, "Running", 120)
    workers = items(testbed, "pods", op_ns, "grpo.dev/role=worker")
    assert sorted(w["spec"]["nodeName"] for w in workers) == [
        "h100-0", "h100-0", "h100-1", "h100-1"]
    for w in workers:
        limits = w["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "4" and int(limits["cpu"]) <= 192 // 2, limits


def test_job_larger_than_the_cluster_stays_pending_and_says_why(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    apply(testbed, op_ns, example_job("grpojob-qwen2vl-72b-h100.yaml", "big"))
    status = wait_phase(testbed, operator, op_ns, "big", "Pending", 60)["status"]
    wait_until("Unschedulable reason", lambda: any(
        c["reason"] == "Unschedulable" for c in job(testbed, op_ns, "big")["status"][
            "conditions"] if c["type"] == "Progressing"), 60)
    assert status["plan"]["rank0Init"] is True


def test_progress_patch_shows_step_and_reward_and_exit_0_succeeds(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "done"))
    wait_phase(testbed, operator, op_ns, "done", "Running")
    testbed.kubectl("patch", "grpojob", "done", "-n", op_ns, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"progress": {
                        "step": 3, "totalSteps": 3, "rewardMean": 0.75,
                        "lastCheckpointStep": 3}}}))
    row = testbed.kubectl("get", "grpojob", "done", "-n", op_ns, "--no-headers").stdout.split()
    assert row[1:3] == ["Running", "2"] and "3" in row and "0.75" in row
    # The trainer's leak detector reports growth: the operator raises MemoryGrowth.
    msg = "host RSS of rank 1 grew 4.1 MB/step over the last 20 steps"
    testbed.kubectl("patch", "grpojob", "done", "-n", op_ns, "--subresource=status",
                    "--type=merge", "--field-manager=grpo-trainer", "-p", json.dumps(
                        {"status": {"progress": {"memoryGrowth": msg}}}))

    def growth() -> dict[str, Any] | None:
        conds = job(testbed, op_ns, "done")["status"]["conditions"]
        return next((c for c in conds if c["type"] == "MemoryGrowth"), None)

    wait_until("MemoryGrowth condition", lambda: (growth() or {}).get("status") == "True", 30)
    assert (growth() or {})["message"] == msg
    events = testbed.kubectl("get", "events", "-n", op_ns,
                             "--field-selector=reason=MemoryGrowth").stdout
    assert "grew 4.1 MB/step" in events
    # The trainer's next report, as it sends it, without growth: the API server's merge
    # removes memoryGrowth (explicit null) and the operator clears the condition.
    calm = Progress(3, 3, 0.75, 3).to_status()
    testbed.kubectl("patch", "grpojob", "done", "-n", op_ns, "--subresource=status",
                    "--type=merge", "--field-manager=grpo-trainer", "-p", json.dumps(
                        {"status": {"progress": calm}}))
    wait_until("MemoryGrowth cleared", lambda: (growth() or {}).get("status") == "False", 30)
    # The head's hub fetch report is shown as the HubFetch condition (its type is in the
    # CRD's enum, or the API server would refuse the operator's whole status write).
    fetch = {"repo": "acme/tiny", "file": "model.safetensors", "bytesDone": 2**29,
             "bytesTotal": 2**30, "state": "Fetching"}
    testbed.kubectl("patch", "grpojob", "done", "-n", op_ns, "--subresource=status",
                    "--type=merge", "--field-manager=grpo-trainer", "-p", json.dumps(
                        {"status": {"progress": {"fetch": fetch}}}))

    def hub() -> dict[str, Any]:
        conds = job(testbed, op_ns, "done")["status"]["conditions"]
        return next((c for c in conds if c["type"] == "HubFetch"), {})

    wait_until("HubFetch condition", lambda: hub().get("reason") == "Fetching", 30)
    assert "acme/tiny: 0.50 of 1.00 GiB" in hub()["message"]
    finished = json.dumps({"reason": "Succeeded", "step": 3, "lastCheckpointStep": 3,
                           "detail": "", "export": {"path": f"/checkpoints/{op_ns}/done/export",
                                                    "step": 3}})
    end_head(testbed, op_ns, "done", 0, "Completed", finished)
    status = wait_phase(testbed, operator, op_ns, "done", "Succeeded")["status"]
    assert status["attempts"][0]["outcome"] == "Succeeded"
    # Where the exported model is, as the API server stored it (the CRD's schema).
    assert status["export"] == {"claimName": "done-checkpoints", "path": f"{op_ns}/done/export",
                                "step": 3}
    assert status["progress"]["rewardMean"] == 0.75  # the trainer's fields survive
    wait_until("RayCluster released", lambda: not items(testbed, "raycluster", op_ns), 60)
    assert items(testbed, "persistentvolumeclaim", op_ns)  # checkpoints stay


def test_head_failure_is_recorded_with_its_class(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "bad",
                                       backoffLimit=0))
    wait_phase(testbed, operator, op_ns, "bad", "Running")
    msg = json.dumps({"reason": "ConfigError", "step": 0,
                      "detail": "data.train_files: no such file"})
    end_head(testbed, op_ns, "bad", 2, "Error", msg)
    status = wait_phase(testbed, operator, op_ns, "bad", "Failed")["status"]
    assert status["attempts"][0]["outcome"] == "ConfigError"
    assert "no such file" in status["attempts"][0]["reason"]
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "ConfigError"


def test_suspend_releases_pods_and_resume_recreates_the_cluster(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "pause"))
    wait_phase(testbed, operator, op_ns, "pause", "Running")
    testbed.kubectl("patch", "grpojob", "pause", "-n", op_ns, "--type=merge",
                    "-p", '{"spec":{"suspend":true}}')
    wait_phase(testbed, operator, op_ns, "pause", "Suspended")
    wait_until("pods released", lambda: not items(testbed, "pods", op_ns), 60)
    assert items(testbed, "persistentvolumeclaim", op_ns)
    testbed.kubectl("patch", "grpojob", "pause", "-n", op_ns, "--type=merge",
                    "-p", '{"spec":{"suspend":false}}')
    status = wait_phase(testbed, operator, op_ns, "pause", "Running")["status"]
    assert status["attempt"] == 0 and len(items(testbed, "raycluster", op_ns)) == 1


def user_claim(tb: Testbed, ns: str, name: str) -> None:
    """A PVC the user made themselves, for checkpoint.claimName."""
    tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))


def test_delete_cascades_but_keeps_a_claim_the_user_made(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    user_claim(testbed, op_ns, "mine")
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "gone",
                                       checkpoint={"claimName": "mine"}))
    wait_phase(testbed, operator, op_ns, "gone", "Running")
    testbed.kubectl("delete", "grpojob", "gone", "-n", op_ns, "--wait=true")
    for kind in ("raycluster", "configmap", "serviceaccount", "role", "rolebinding"):
        wait_until(f"{kind} collected",
                   lambda k=kind: not items(testbed, k, op_ns, "grpo.dev/job=gone"), 60)
    names = [p["metadata"]["name"] for p in items(testbed, "persistentvolumeclaim", op_ns)]
    assert names == ["mine"]


def test_a_users_claim_goes_with_the_job_when_asked(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    user_claim(testbed, op_ns, "mine")
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "all",
                                       checkpoint={"claimName": "mine",
                                                   "retention": "Delete"}))
    wait_phase(testbed, operator, op_ns, "all", "Running")
    testbed.kubectl("delete", "grpojob", "all", "-n", op_ns, "--wait=true")
    wait_until("the user's claim deleted too",
               lambda: not items(testbed, "persistentvolumeclaim", op_ns), 60)


def test_a_kept_claim_outlives_its_job_and_a_job_created_again_adopts_it(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "kept"))
    wait_phase(testbed, operator, op_ns, "kept", "Running")
    first = job(testbed, op_ns, "kept")["metadata"]["uid"]
    # Deleted while garbage collection has not reached its cluster yet (orphaned here,
    # so the pods stay as long as the test needs).
    testbed.kubectl("delete", "grpojob", "kept", "-n", op_ns, "--cascade=orphan",
                    "--wait=true")
    claims = items(testbed, "persistentvolumeclaim", op_ns, "grpo.dev/job=kept")
    assert [c["metadata"]["name"] for c in claims] == ["kept-checkpoints"]
    assert claims[0]["metadata"]["labels"]["grpo.dev/job-uid"] == first
    assert "deletionTimestamp" not in claims[0]["metadata"]
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "kept"))
    again = job(testbed, op_ns, "kept")["metadata"]["uid"]
    assert again != first

    def progressing() -> str:
        conds = job(testbed, op_ns, "kept").get("status", {}).get("conditions") or []
        return next((c["reason"] for c in conds if c["type"] == "Progressing"), "")

    wait_until("WaitingForPreviousJob", lambda: progressing() == "WaitingForPreviousJob", 30)
    testbed.kubectl("delete", "raycluster", "kept-a0", "-n", op_ns, "--wait=true")
    wait_phase(testbed, operator, op_ns, "kept", "Running", 120)
    wait_until("the claim relabelled", lambda: items(
        testbed, "persistentvolumeclaim", op_ns, f"grpo.dev/job-uid={again}"), 30)
    claim = items(testbed, "persistentvolumeclaim", op_ns, "grpo.dev/job=kept")[0]
    assert "ownerReferences" not in claim["metadata"]  # still kept
    events = testbed.kubectl("get", "events", "-n", op_ns,
                             "--field-selector=reason=ClaimAdopted").stdout
    assert "kept-checkpoints" in events and first in events
    rc = items(testbed, "raycluster", op_ns, "grpo.dev/job=kept")
    assert [r["metadata"]["ownerReferences"][0]["uid"] for r in rc] == [again]


def test_a_claim_with_retention_delete_goes_with_its_job(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "temp",
                                       checkpoint={"size": "1Gi", "retention": "Delete"}))
    wait_phase(testbed, operator, op_ns, "temp", "Running")
    uid = job(testbed, op_ns, "temp")["metadata"]["uid"]
    claim = items(testbed, "persistentvolumeclaim", op_ns, "grpo.dev/job=temp")[0]
    assert [o["uid"] for o in claim["metadata"]["ownerReferences"]] == [uid]
    testbed.kubectl("delete", "grpojob", "temp", "-n", op_ns, "--wait=true")
    wait_until("the claim deleted with its job", lambda: not items(
        testbed, "persistentvolumeclaim", op_ns, "grpo.dev/job=temp"), 60)


def test_missing_claim_is_a_condition_not_a_crash(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "noclaim",
                                       checkpoint={"claimName": "absent"}))
    wait_until("ClaimMissing event", lambda: "ClaimMissing" in testbed.kubectl(
        "get", "events", "-n", op_ns).stdout, 60)
    assert phase(testbed, op_ns, "noclaim") == "Pending"
    assert not items(testbed, "raycluster", op_ns)


def test_webhook_refuses_an_infeasible_job_with_the_planner_numbers(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    doc = example_job("grpojob-qwen2vl-72b-h100.yaml", "toobig",
                       resources={"gpuType": "A100-40GB", "nodes": 1, "gpusPerNode": 1})
    out = apply(testbed, op_ns, doc, check=False)
    assert out.returncode != 0
    assert "memory planner refuses" in out.stderr and "GiB" in out.stderr


def test_webhook_refuses_more_gpus_per_node_than_the_type_has_naming_the_field(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    """16 GPUs per worker on H100-80GB (8 per node): a worker pod runs on one node, so it
    would sit Pending; the webhook refuses it at apply with the same GPUs as a fix."""
    doc = example_job("grpojob-qwen25vl-7b-h100.yaml", "sixteen",
                      resources={"gpuType": "H100-80GB", "nodes": 1, "gpusPerNode": 16})
    out = apply(testbed, op_ns, doc, check=False)
    assert out.returncode != 0
    assert ("spec.resources.gpusPerNode: 16 is more than the 8 GPUs a H100-80GB node has"
            in out.stderr), out.stderr
    assert "resources.nodes: 2 with gpusPerNode: 8" in out.stderr
    assert not items(testbed, "grpojob", op_ns)


def test_gpu_types_are_the_operators_catalog_with_the_charts_additions(
        testbed: Testbed, operator: OperatorProcess, op_ns: str,
        added_gpu: tuple[str, dict[str, Any]]) -> None:
    gpu, entry = added_gpu
    unknown = example_job("grpojob-qwen25vl-7b-h100.yaml", "unknown-gpu",
                          resources={"gpuType": "H900-96GB", "nodes": 1})
    out = apply(testbed, op_ns, unknown, check=False)
    assert out.returncode != 0
    assert "spec.resources.gpuType: unknown GPU type 'H900-96GB'" in out.stderr
    assert "B200-180GB" in out.stderr and gpu in out.stderr  # the known ones, listed
    apply(testbed, op_ns, example_job("grpojob-qwen25vl-7b-h100.yaml", "added-gpu",
                                      resources={"gpuType": gpu, "nodes": 1}))
    wait_until("RayCluster added-gpu-a0", lambda: bool(items(testbed, "raycluster", op_ns)), 30)
    worker = items(testbed, "raycluster", op_ns)[0]["spec"]["workerGroupSpecs"][0]
    selector = worker["template"]["spec"]["nodeSelector"]
    assert selector == {"nvidia.com/gpu.product": entry["productLabel"]}


def test_webhook_refuses_immutable_edits_and_allows_memory_edits(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "edit"))
    wait_phase(testbed, operator, op_ns, "edit", "Running")
    bad = testbed.kubectl("patch", "grpojob", "edit", "-n", op_ns, "--type=merge", "-p",
                          '{"spec":{"model":{"path":"/models/other"}}}', check=False)
    assert bad.returncode != 0 and "spec.model cannot change" in bad.stderr
    testbed.kubectl("patch", "grpojob", "edit", "-n", op_ns, "--type=merge", "-p",
                    '{"spec":{"memory":{"gradientCheckpointing":true}}}')
    # Takes effect at the next attempt: the running cluster is not replaced.
    time.sleep(2)
    assert phase(testbed, op_ns, "edit") == "Running"
    assert [r["metadata"]["name"] for r in items(testbed, "raycluster", op_ns)] == ["edit-a0"]


def test_metrics_and_healthz(testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "seen"))
    wait_phase(testbed, operator, op_ns, "seen", "Running")
    text = operator.metrics()
    running = [ln for ln in text.splitlines()
               if ln.startswith('grpo_operator_jobs{phase="Running"}')]
    assert running and float(running[0].split()[-1]) >= 1
    assert "grpo_operator_reconcile_duration_seconds_count" in text
    # No decision on a spec change planned more than once (the bucket of at most one
    # plan holds them all), and the job's were planned.
    plans = "grpo_operator_plans_per_decision"
    decisions = sample(text, f'{plans}_count{{event="SpecChanged"}}')
    assert decisions >= 1 and sample(text, f'{plans}_sum{{event="SpecChanged"}}') >= 1
    assert sample(text, f'{plans}_bucket{{event="SpecChanged",le="1.0"}}') == decisions


def sample(metrics: str, series: str) -> float:
    """The value of one series in Prometheus's text format."""
    return next(float(ln.split()[-1]) for ln in metrics.splitlines()
                if ln.startswith(series + " "))


@pytest.mark.parametrize("jobs", [5])
def test_operator_killed_mid_reconcile_converges_without_duplicates(
        testbed: Testbed, operator: OperatorProcess, op_ns: str, jobs: int) -> None:
    for i in range(jobs):
        apply(testbed, op_ns, example_job("grpojob-tiny.yaml", f"j{i}"))
    operator.kill()
    operator.start()
    for i in range(jobs):
        wait_phase(testbed, operator, op_ns, f"j{i}", "Running", 120)
    clusters = [r["metadata"]["name"] for r in items(testbed, "raycluster", op_ns)]
    assert sorted(clusters) == sorted(f"j{i}-a0" for i in range(jobs))
    for i in range(jobs):
        attempts = job(testbed, op_ns, f"j{i}")["status"]["attempts"]
        assert [a["index"] for a in attempts] == [0]


def test_operator_survives_an_api_server_restart(
        testbed: Testbed, operator: OperatorProcess, op_ns: str) -> None:
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "before"))
    wait_phase(testbed, operator, op_ns, "before", "Running")
    testbed.restart("kube-apiserver")
    # Watches were cut; the operator must reconnect and keep reconciling.
    apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "after"))
    wait_phase(testbed, operator, op_ns, "after", "Running", 180)
    end_head(testbed, op_ns, "before", 0, "Completed")
    wait_phase(testbed, operator, op_ns, "before", "Succeeded", 120)
    assert operator.proc is not None and operator.proc.poll() is None


def test_only_one_replica_acts_under_kopf_peering(
        testbed: Testbed, grpo_crd: Testbed, ns: str, tmp_path: Path) -> None:
    """Two operators in one peering: the lower-priority one pauses, so each job is
    reconciled by exactly one replica. (`ns` is outside op-*, which the module's shared
    operator watches.)"""
    op_ns = ns
    testbed.kubectl("apply", "--server-side", "-f",
                    str(EXAMPLES.parent / "charts/grpo-operator/crds/kopf-peering.yaml"))
    testbed.kubectl("wait", "--for", "condition=established", "crd/kopfpeerings.kopf.dev")
    testbed.kubectl("apply", "-n", op_ns, "-f", "-", input=yaml.safe_dump({
        "apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "grpo"}}))
    ops = [OperatorProcess(testbed, tmp_path / n, webhook=False, namespaces=(op_ns,),
                           extra_args=("--peering", "grpo", "--priority", p))
           for n, p in (("high", "100"), ("low", "10"))]
    for op in ops:
        op.start()
    try:
        def peers() -> int:
            obj = json.loads(testbed.kubectl("get", "kopfpeering", "grpo", "-n", op_ns,
                                             "-o", "json").stdout)
            return len(obj.get("status") or {})

        wait_until("both replicas in the peering", lambda: peers() >= 2, 60)
        apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "peer"))
        wait_phase(testbed, ops[0], op_ns, "peer", "Running")
        assert "grpojob_reconcile" in ops[0].log.read_text()
        assert "grpojob_reconcile" not in ops[1].log.read_text()
        # Failover: the active replica stops; the paused one takes over.
        ops[0].stop()
        wait_until("the other replica resumes",
                   lambda: "Resuming operations" in ops[1].log.read_text(), 90)
        apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "peer2"))
        wait_phase(testbed, ops[1], op_ns, "peer2", "Running")
    finally:
        # While an operator runs: a Running job carries Kopf's finalizer (its progress
        # timer), which only an operator removes.
        testbed.kubectl("delete", "grpojobs", "--all", "-n", op_ns, "--wait=true",
                        "--timeout=60s", check=False)
        for op in ops:
            op.stop()
