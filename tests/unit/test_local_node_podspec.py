"""The local node agent's kubelet rules, on pod shapes as the API server returns them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from grpo_testbed.local_node import podspec, sandbox
from grpo_testbed.local_node.sandbox import start_script

POD: dict[str, Any] = {
    "metadata": {"name": "tiny-a0-head-x", "namespace": "demo", "uid": "u-1",
                 "labels": {"ray.io/cluster": "tiny-a0", "grpo.dev/attempt": "0"}},
    "spec": {
        "nodeName": "local-0",
        "serviceAccountName": "tiny-trainer",
        "containers": [{
            "name": "ray-head", "image": "trainer:1",
            "command": ["/bin/bash", "-lc", "--"], "args": ["exec python -m grpo_trainer"],
            "env": [
                {"name": "A", "value": "x"},
                {"name": "B", "value": "$(A)-y-$(MISSING)"},
                {"name": "CLUSTER", "valueFrom": {"fieldRef": {
                    "fieldPath": "metadata.labels['ray.io/cluster']"}}},
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                # The API server defaults divisor to "0"; the kubelet reads that as 1.
                {"name": "MEM", "valueFrom": {"resourceFieldRef": {
                    "resource": "limits.memory", "divisor": "0"}}},
                {"name": "CPUS", "valueFrom": {"resourceFieldRef": {
                    "resource": "limits.cpu", "divisor": "1"}}},
            ],
            "resources": {"limits": {"cpu": "1500m", "memory": "12Gi"}},
            "volumeMounts": [
                {"name": "checkpoints", "mountPath": "/checkpoints"},
                {"name": "config", "mountPath": "/etc/grpo", "readOnly": True},
                {"name": "dshm", "mountPath": "/dev/shm"},
            ],
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "FallbackToLogsOnError",
        }],
        "volumes": [
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "tiny-checkpoints"}},
            {"name": "config", "configMap": {"name": "tiny-config-0"}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}},
        ],
    },
}


def test_env_resolves_like_the_kubelet() -> None:
    env = podspec.resolve_env(POD, POD["spec"]["containers"][0], "127.0.0.1", {}, {"PATH": "/b"})
    assert env["PATH"] == "/b"
    assert env["B"] == "x-y-$(MISSING)"  # unknown references stay as written
    assert env["CLUSTER"] == "tiny-a0" and env["NS"] == "demo" and env["IP"] == "127.0.0.1"
    assert env["MEM"] == str(12 * 2**30)
    assert env["CPUS"] == "2"  # 1.5 CPUs rounded up


def test_unsupported_env_source_names_the_variable() -> None:
    c = {"name": "c", "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s"}}}]}
    with pytest.raises(podspec.PodSpecError, match="env S") as err:
        podspec.resolve_env(POD, c, "127.0.0.1", {}, {})
    assert err.value.reason == "CreateContainerConfigError"


def test_container_plan_mounts_and_limit() -> None:
    vols = podspec.volume_plans(POD)
    assert vols["dshm"] == podspec.VolumePlan("dshm", "tmpfs", size_bytes=4 * 2**30)
    dirs = {"checkpoints": "/node/claims/demo/tiny-checkpoints", "config": "/pod/config",
            "dshm": ""}
    plan = podspec.container_plan(POD, POD["spec"]["containers"][0], dirs, vols, {})
    assert plan.argv == ["/bin/bash", "-lc", "--", "exec python -m grpo_trainer"]
    assert plan.memory_limit == 12 * 2**30
    assert podspec.Mount("/etc/grpo", "/pod/config", True) in plan.mounts
    assert podspec.Mount("/dev/shm", None, False, 4 * 2**30) in plan.mounts
    script = start_script(plan, Path("/cg/cgroup.procs"), Path("/t/term"),
                          Path("/t/profile"), Path("/t/tmp"))
    lines = script.splitlines()
    assert lines[1] == "echo $$ > /cg/cgroup.procs"  # in the cgroup before anything runs
    assert "mount -o remount,bind,ro /etc/grpo" in lines
    assert lines.index("mount --rbind /t/tmp /tmp") > lines.index(
        "mount --bind /pod/config /etc/grpo")  # /tmp last: sources may live under it
    assert lines[-1] == 'exec "$@"'


def test_an_image_under_the_hosts_tmp_stays_visible_in_the_private_tmp(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A checkout cloned under /tmp: its virtualenv is the "image" and must not vanish
    # behind the container's own /tmp (`ray: command not found` in every attempt).
    monkeypatch.setattr(sandbox, "IMAGE_ROOTS", (Path("/tmp/clone/.venv"), Path("/opt/x")))
    plan = podspec.container_plan(POD, POD["spec"]["containers"][0], {
        "checkpoints": "/c", "config": "/p", "dshm": ""}, podspec.volume_plans(POD), {})
    lines = sandbox.start_script(plan, Path("/cg"), Path("/t/term"), Path("/t/profile"),
                                 Path("/t/tmp")).splitlines()
    bind = "mount --bind /tmp/clone/.venv /t/tmp/clone/.venv"
    assert lines.index(bind) < lines.index("mount --rbind /t/tmp /tmp")
    assert not [line for line in lines if "/opt/x" in line]  # not under /tmp: untouched


def test_a_container_without_command_cannot_run_here() -> None:
    c = {**POD["spec"]["containers"][0], "command": None, "volumeMounts": []}
    with pytest.raises(podspec.PodSpecError, match="runs commands, not images"):
        podspec.container_plan(POD, c, {}, {}, {})


def test_unsupported_volume_is_refused_by_name() -> None:
    pod = {"spec": {"volumes": [{"name": "h", "hostPath": {"path": "/x"}}]}}
    with pytest.raises(podspec.PodSpecError, match="volume h"):
        podspec.volume_plans(pod)


@pytest.mark.parametrize(("rc", "oom", "code", "reason"), [
    (0, False, 0, "Completed"),
    (3, False, 3, "Error"),
    (-9, True, 137, "OOMKilled"),
    (-15, False, 143, "Error"),
])
def test_terminated_state(rc: int, oom: bool, code: int, reason: str) -> None:
    st = podspec.terminated_state(rc, oom, "", "", False, "t0", "t1", "local://1")
    assert (st["exitCode"], st["reason"]) == (code, reason)


def test_termination_message_falls_back_to_the_log_tail_and_is_capped() -> None:
    logs = "\n".join(f"line {i}" for i in range(200))
    st = podspec.terminated_state(1, False, "", logs, True, "t0", "t1", "c")
    assert st["message"].endswith("line 199") and "line 119" not in st["message"]
    big = podspec.terminated_state(1, False, "x" * 10_000, "", True, "t0", "t1", "c")
    assert len(big["message"]) == podspec.TERMINATION_MESSAGE_LIMIT
    own = podspec.terminated_state(3, False, '{"reason": "CudaOOM"}', logs, True, "t", "t", "c")
    assert own["message"] == '{"reason": "CudaOOM"}'


def test_pod_phase_follows_its_containers() -> None:
    run = {"ray-head": {"running": {"startedAt": "t0"}}}
    st = podspec.pod_status(POD, "127.0.0.1", run, "t1", "t0", {"ray-head": "local://7"})
    assert st["phase"] == "Running" and st["containerStatuses"][0]["ready"]
    assert st["containerStatuses"][0]["containerID"] == "local://7"
    failed = {"ray-head": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
    assert podspec.pod_status(POD, "127.0.0.1", failed, "t2", "t0")["phase"] == "Failed"
    ok = {"ray-head": {"terminated": {"exitCode": 0, "reason": "Completed"}}}
    assert podspec.pod_status(POD, "127.0.0.1", ok, "t2", "t0")["phase"] == "Succeeded"
