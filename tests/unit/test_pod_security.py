"""The Ray pods pass Pod Security `restricted` as rendered; what a namespace's level or GPU
quota would refuse is refused at apply, naming the field, the level and the fix (pure)."""

from __future__ import annotations

import copy
import os
import re
import resource
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest

from grpo_api.contract import IMAGE_UID
from grpo_api.job import load_manifest
from grpo_api.job.status import GRPOJobStatus
from grpo_operator import reconcile as rec
from grpo_operator.config import OperatorConfig
from grpo_operator.main import PodUid
from grpo_operator.namespace_policy import (
    GpuQuota,
    NamespaceFacts,
    pod_violations,
    template_gpus,
    templates,
)
from grpo_operator.reconcile.attempts import ensure_attempt
from grpo_operator.reconcile.planning import Planner
from grpo_operator.render import JobRef, render_ray_cluster
from grpo_operator.render.children import HEAD_COMMAND, OPEN_FILES, WORKER_COMMAND
from grpo_operator.render.model_reader import render_model_reader
from grpo_operator.render.security import container_security_context, pod_security_context
from grpo_operator.webhook import admission_problem
from grpo_testbed.status_patch import apply_status_patch

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
GPU_JOB = load_manifest(ROOT / "examples/grpojob-qwen25vl-7b-h100.yaml").spec.to_wire()
ENFORCE = "pod-security.kubernetes.io/enforce"


def ns(level: str | None = None, *quotas: GpuQuota) -> NamespaceFacts:
    return NamespaceFacts("team-a", {ENFORCE: level} if level else {}, quotas)


def ray_cluster(spec: dict[str, Any]) -> dict[str, Any]:
    action = ensure_attempt(JobRef("j", "team-a", "u"), Planner(spec).plan([], None),
                            GRPOJobStatus(), "2026-01-01T00:00:00Z", "img")
    return next(c for c in action.children if c["kind"] == "RayCluster")


def with_pods(**sections: Any) -> dict[str, Any]:
    spec = copy.deepcopy(GPU_JOB)
    spec["pods"] = sections
    return spec


def test_the_images_user_is_the_one_the_pods_run_as() -> None:
    for image in ("trainer", "operator"):
        text = (ROOT / f"images/{image}/Dockerfile").read_text()
        assert re.findall(r"^USER (\S+)$", text, re.M)[-1] == f"{IMAGE_UID}:{IMAGE_UID}"


def test_every_ray_container_and_pod_passes_restricted_as_rendered() -> None:
    pods = templates(ray_cluster(GPU_JOB))  # the 7B example: hub model, one worker
    assert set(pods) == {"head", "worker"}
    assert [c["name"] for c in pods["head"]["initContainers"]] == ["hub-fetch"]
    for pod in pods.values():
        assert pod_violations(pod, "restricted") == []
        assert pod["securityContext"] == {
            "runAsNonRoot": True, "runAsUser": IMAGE_UID, "runAsGroup": IMAGE_UID,
            "fsGroup": IMAGE_UID, "seccompProfile": {"type": "RuntimeDefault"}}
        for c in [*(pod.get("initContainers") or []), *pod["containers"]]:
            assert c["securityContext"] == {"allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]}}


def test_the_checker_sees_what_restricted_refuses() -> None:
    """Pods without the operator's settings break every rule the operator's keep."""
    bare = {"containers": [{"name": "c"}], "volumes": [{"name": "v", "emptyDir": {}}]}
    assert pod_violations(bare, "baseline") == []
    assert sorted(v.path for v in pod_violations(bare, "restricted")) == [
        "containers[c].securityContext.allowPrivilegeEscalation",
        "containers[c].securityContext.capabilities.drop",
        "containers[c].securityContext.seccompProfile",
        "securityContext.runAsNonRoot"]
    host = {**bare, "hostNetwork": True,
            "containers": [{"name": "c", "securityContext": {"privileged": True}}]}
    assert {v.path for v in pod_violations(host, "baseline")} == {
        "hostNetwork", "containers[c].securityContext.privileged"}


def test_capabilities_a_fabric_needs_are_added_back_and_leave_restricted() -> None:
    ctx = container_security_context(["IPC_LOCK", "cap_ipc_lock"])
    assert ctx == {"allowPrivilegeEscalation": False,
                   "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]}}
    pod = {"securityContext": pod_security_context(),
           "containers": [{"name": "ray-worker", "securityContext": ctx}]}
    assert pod_violations(pod, "privileged") == []
    (why,) = pod_violations(pod, "baseline")
    assert why.path == "containers[ray-worker].securityContext.capabilities.add"
    assert "IPC_LOCK" in why.why
    baseline_cap = {"name": "c", "securityContext": container_security_context(["CHOWN"])}
    assert pod_violations({**pod, "containers": [baseline_cap]}, "baseline") == []
    assert [v.path for v in pod_violations({**pod, "containers": [baseline_cap]},
                                           "restricted")] == [
        "containers[c].securityContext.capabilities.add"]


def test_a_users_security_context_wins_field_by_field() -> None:
    assert pod_security_context({"runAsUser": 2000, "fsGroup": None})["runAsUser"] == 2000
    assert pod_security_context({"runAsUser": 2000})["fsGroup"] == IMAGE_UID
    root = pod_security_context({"runAsUser": 0})
    assert "runAsNonRoot" not in root  # else the kubelet would refuse to start it
    assert pod_security_context({"runAsUser": 0, "runAsNonRoot": False})["runAsNonRoot"] is False


# ---- the UID left for the platform to assign (--trainer-pod-uid=unset) -----------------

PLATFORM_ASSIGNED = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def test_with_the_uid_unset_the_pods_omit_uid_gid_and_fsgroup_and_still_pass_restricted(
        ) -> None:
    """OpenShift's restricted-v2 SCC assigns runAsUser, runAsGroup and fsGroup from the
    namespace's range and refuses a fixed 10001: the operator leaves all three out and
    keeps runAsNonRoot, which `restricted` asks for (and the kubelet then checks)."""
    spec = Planner(GPU_JOB).plan([], None)
    action = ensure_attempt(JobRef("j", "team-a", "u"), spec, GRPOJobStatus(),
                            "2026-01-01T00:00:00Z", "img", pod_uid=None)
    (rc,) = [c for c in action.children if c["kind"] == "RayCluster"]
    pods = templates(rc)
    assert set(pods) == {"head", "worker"}
    for pod in pods.values():
        assert pod["securityContext"] == PLATFORM_ASSIGNED
        for level in ("baseline", "restricted"):
            assert pod_violations(pod, level) == []
        for c in [*(pod.get("initContainers") or []), *pod["containers"]]:
            assert c["securityContext"] == {"allowPrivilegeEscalation": False,
                                            "capabilities": {"drop": ["ALL"]}}
    # The webhook's Pod Security verdict is the same either way: it renders with the
    # default UID, and neither form sets a UID of 0.
    assert pods == templates(render_ray_cluster(
        spec.spec, spec.plan, JobRef("j", "team-a", "u"), 0, "img", pod_uid=None))


def test_with_the_uid_unset_a_users_fields_still_win_and_root_still_drops_non_root() -> None:
    assert pod_security_context(uid=None) == PLATFORM_ASSIGNED
    assert pod_security_context({"fsGroup": 3000}, uid=None) == {**PLATFORM_ASSIGNED,
                                                                 "fsGroup": 3000}
    assert pod_security_context(uid=2000) == {
        "runAsNonRoot": True, "runAsUser": 2000, "runAsGroup": 2000, "fsGroup": 2000,
        "seccompProfile": {"type": "RuntimeDefault"}}
    assert "runAsNonRoot" not in pod_security_context({"runAsUser": 0}, uid=None)
    bare = {"securityContext": PLATFORM_ASSIGNED, "containers": [
        {"name": "c", "securityContext": container_security_context()}]}
    assert pod_violations(bare, "restricted") == []
    root = {**bare, "securityContext": pod_security_context({"runAsUser": 0}, uid=None)}
    assert [v.path for v in pod_violations(root, "restricted")] == [
        "securityContext.runAsUser"]


def _reconciled(job: dict[str, Any], action: rec.Action) -> dict[str, Any]:
    return {**job, "status": apply_status_patch(job["status"], action.status)}


def test_the_operators_setting_reaches_every_pod_it_makes_from_the_trainer_image() -> None:
    """OperatorConfig.trainer_pod_uid (--trainer-pod-uid) through reconcile: the first
    attempt's Ray pods, the next attempt's after a failure, and the model-config reader."""
    config = OperatorConfig(default_image="img", trainer_pod_uid=None)
    job = {"metadata": {"name": "j", "namespace": "team-a", "uid": "u", "generation": 1},
           "spec": copy.deepcopy(GPU_JOB) | {"recovery": {"backoff": {"initialSeconds": 1}}},
           "status": {}}

    def ray_pods(action: rec.Action) -> list[dict[str, Any]]:
        (rc,) = [c for c in action.children if c["kind"] == "RayCluster"]
        return list(templates(rc).values())

    action = rec.reconcile(job, rec.Observed(), rec.SpecChanged(), "2026-01-01T00:00:00Z",
                           config)
    assert [p["securityContext"] for p in ray_pods(action)] == [PLATFORM_ASSIGNED] * 2
    job = _reconciled(job, action)
    head = {"metadata": {"name": "h", "labels": {"grpo.dev/job": "j", "grpo.dev/attempt": "0",
                                                  "grpo.dev/role": "head"}},
            "status": {"phase": "Failed", "containerStatuses": [{"name": "ray", "state": {
                "terminated": {"exitCode": 3, "message": '{"reason": "CudaOOM"}'}}}]}}
    job = _reconciled(job, rec.reconcile(job, rec.Observed(), rec.PodChanged(head),
                                         "2026-01-01T00:01:00Z", config))
    assert job["status"]["nextAttempt"]["index"] == 1
    action = rec.reconcile(job, rec.Observed(), rec.BackoffTimer(), "2026-01-01T01:00:00Z",
                           config)
    assert [p["securityContext"] for p in ray_pods(action)] == [PLATFORM_ASSIGNED] * 2

    on_claim = {**job, "spec": copy.deepcopy(GPU_JOB), "status": {}}
    on_claim["spec"]["model"] = {"path": "/models/sft", "claimName": "models"}
    claim = {"metadata": {"name": "models"}, "spec": {"accessModes": ["ReadOnlyMany"]}}
    action = rec.reconcile(on_claim, rec.Observed(model_claim=claim), rec.SpecChanged(),
                           "2026-01-01T00:00:00Z", config)
    (reader,) = [c for c in action.children if c["kind"] == "Pod"]
    assert reader["spec"]["securityContext"] == PLATFORM_ASSIGNED
    spec = load_manifest(ROOT / "examples/grpojob-qwen25vl-7b-h100.yaml").spec
    assert render_model_reader(spec, JobRef("j", "team-a", "u"), "https://hub.example/x",
                               "img")["spec"]["securityContext"]["runAsUser"] == IMAGE_UID


@pytest.mark.parametrize(("given", "uid"), [("10001", 10001), ("1000680000", 1000680000),
                                            ("unset", None), ("UNSET", None)])
def test_the_trainer_pod_uid_flag_takes_a_uid_or_unset(given: str, uid: int | None) -> None:
    assert PodUid().convert(given, None, None) == uid


@pytest.mark.parametrize(("given", "words"), [("0", "not a non-root UID"),
                                              ("-5", "not a non-root UID"),
                                              ("root", "neither a UID nor 'unset'")])
def test_the_trainer_pod_uid_flag_refuses_root_and_words_saying_what_to_give(
        given: str, words: str) -> None:
    with pytest.raises(click.BadParameter, match=words):
        PodUid().convert(given, None, None)


@pytest.mark.parametrize("level", ["privileged", "baseline", "restricted", None])
def test_the_examples_are_admitted_at_every_level(level: str | None) -> None:
    assert admission_problem(GPU_JOB, None, namespace=ns(level)) is None


def test_hostpath_in_a_baseline_namespace_is_refused_naming_field_level_and_fix() -> None:
    spec = with_pods(workers={"volumes": [{"name": "scratch", "hostPath": {"path": "/mnt"}}],
                              "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]})
    problem = admission_problem(spec, None, namespace=ns("baseline"))
    assert problem is not None
    assert "spec.pods.workers.volumes[0].hostPath: hostPath volumes are forbidden" in problem
    assert "namespace team-a enforces Pod Security 'baseline'" in problem
    assert f"{ENFORCE}=baseline" in problem
    assert "persistentVolumeClaim" in problem  # the fix
    assert admission_problem(spec, None, namespace=ns("privileged")) is None
    assert admission_problem(spec, None) is None  # facts unknown: the spec alone


def test_restricted_refuses_what_baseline_allows() -> None:
    spec = with_pods(common={"volumes": [{"name": "nfs", "nfs": {"server": "s", "path": "/"}}],
                             "securityContext": {"runAsUser": 0}})
    assert admission_problem(spec, None, namespace=ns("baseline")) is None
    problem = admission_problem(spec, None, namespace=ns("restricted")) or ""
    assert "spec.pods.common.volumes[0].nfs: nfs volumes are forbidden" in problem
    assert "spec.pods.common.securityContext.runAsUser: running as root (0)" in problem
    assert problem.count("spec.pods.common.volumes[0]") == 1  # once, not per pod


def test_unconfined_seccomp_is_refused_from_baseline_up() -> None:
    spec = with_pods(head={"securityContext": {"seccompProfile": {"type": "Unconfined"}}})
    problem = admission_problem(spec, None, namespace=ns("baseline")) or ""
    assert "spec.pods.head.securityContext.seccompProfile" in problem


def test_a_gpu_quota_smaller_than_the_job_is_refused_with_the_numbers() -> None:
    gpus = template_gpus(ray_cluster(GPU_JOB))
    assert gpus == 8  # the 7B example: one 8-GPU worker
    tight = ns(None, GpuQuota("team-gpus", "16", "12"))
    problem = admission_problem(GPU_JOB, None, namespace=tight) or ""
    assert "needs 8 GPU(s)" in problem and "ResourceQuota team-gpus" in problem
    assert "leaves 4 (hard 16, used 12)" in problem
    assert admission_problem(GPU_JOB, None, namespace=ns(None, GpuQuota("q", "16", "8"))) \
        is None
    # An edit of a live job: its own pods are in `used`, so the quota is not checked.
    edited = copy.deepcopy(GPU_JOB) | {"suspend": True}
    assert admission_problem(edited, GPU_JOB, namespace=tight) is None


def _soft_open_files_after_the_prefix(hard: int) -> str:
    def as_a_user_with_hard_limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(1024, hard), hard))
        if os.getuid() == 0:  # no capabilities, like the Ray containers
            os.setgid(65534)
            os.setuid(65534)

    return subprocess.run(["bash", "-c", f"{OPEN_FILES}ulimit -Sn"], capture_output=True,
                          text=True, check=True, preexec_fn=as_a_user_with_hard_limit
                          ).stdout.strip()


def test_the_ray_commands_raise_open_files_without_root() -> None:
    assert HEAD_COMMAND.startswith(OPEN_FILES) and WORKER_COMMAND.startswith(OPEN_FILES)
    # Below 65536 the hard limit is as far as a non-root process can go; the
    # previous `ulimit -n 65536` left the soft limit at 1024 there.
    assert _soft_open_files_after_the_prefix(4096) == "4096"
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard == resource.RLIM_INFINITY or hard >= 65536:  # this machine allows more
        assert _soft_open_files_after_the_prefix(min(hard, 100_000)) == "65536"
