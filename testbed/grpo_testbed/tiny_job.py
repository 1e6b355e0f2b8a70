"""The main job end to end: the chart, the operator in the cluster, and a tiny GRPOJob
that really trains on the testbed's real node.

Shared by `grpo-testbed demo` (which narrates it) and the e2e tier (which asserts on
it). `helm install` runs the operator from its image, as the chart deploys it; the job
runs as a CPU Ray head pod (Ray and the driver) and a worker pod (both ranks), each in
its own network namespace, from the product's trainer image. Faults come from the
testbed's one fault switch (faults.py): env that its webhook adds to matching pods.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpo_api.contract import (
    ATTEMPT_EVENTS,
    ATTEMPT_LABEL,
    JOB_LABEL,
    ROLE_LABEL,
    TERMINAL_PHASES,
    Env,
    Role,
)

from .faults import EnvInjection
from .images import OPERATOR, REPO, TRAINER_CPU
from .launcher import Testbed, running_testbed
from .node.runtime import RealNode
from .processes import wait_until
from .versions import binary

CHART = REPO / "charts" / "grpo-operator"
EXAMPLE = REPO / "examples" / "grpojob-tiny.yaml"
JOB_NS = "grpo-demo"
OPERATOR_NS = "grpo-system"
RELEASE = "grpo"
OPERATOR_DEPLOYMENT = f"{RELEASE}-grpo-operator"
JOB = "tiny"
DISAGGREGATED_JOB = "tiny-apart"
LEAK_STEP = 2  # attempt 0's ranks leak from this step on (worker_oom)
LEAK_MIB = 1024  # per rank per step, the most the switch allows: the worker's 11Gi in ~3 steps
TERMINAL = tuple(p.value for p in TERMINAL_PHASES)
# The chart's values for the testbed: the images built here, nothing read from the public
# hub (nothing leaves the testbed), one operator without peering, and no CPU request for
# the operator's pod (limit 1 CPU): on 2 cores the tiny job's head (1 CPU) and worker
# (1 CPU) need all the node's allocatable CPU, so 100m more would leave the worker Pending.
CHART_VALUES = {
    "image.repository": OPERATOR.tag.rsplit(":", 1)[0],
    "image.tag": OPERATOR.tag.rsplit(":", 1)[1],
    "image.pullPolicy": "Never",
    "trainerImage": TRAINER_CPU.tag,
    "leaderElection.enabled": "false",
    "replicaCount": "1",
    "readPublicHub": "false",
    "resources.requests.cpu": "0",
    "watchNamespaces": f"{{{JOB_NS}}}",
}


def worker_oom(leak_step: int = LEAK_STEP) -> tuple[EnvInjection, EnvInjection]:
    """Attempt 0's worker pod runs out of memory and the kernel kills it at its limit.

    The driver (head) reads ``leak_host`` into the config it hands every rank, so from
    ``leak_step`` on both ranks (in the worker pod) keep 1 GiB more each step. Ray's
    memory monitor, which would kill a rank at 95% of the limit first (RayOOM) whenever its
    250 ms poll sees the usage between 95% and 100%, is off in that pod only
    (`RAY_memory_monitor_refresh_ms=0`, read by the raylet at `ray start`), so the kernel's
    OOM kill at the limit is what ends it (the node ends the container whole, as cgroup v2
    does: node/oom_group.py): `OOMKilled`, exit 137, HostOOM. The restarted attempt runs
    clean, with the monitor on."""
    attempt0 = {JOB_LABEL: JOB, ATTEMPT_LABEL: "0"}
    return (EnvInjection({**attempt0, ROLE_LABEL: Role.HEAD.value},
                         {Env.FAULT_INJECT.value: f"leak_host:{LEAK_MIB}@step={leak_step}"}),
            EnvInjection({**attempt0, ROLE_LABEL: Role.WORKER.value},
                         {"RAY_memory_monitor_refresh_ms": "0"}))


def example() -> dict[str, Any]:
    return dict(yaml.safe_load(EXAMPLE.read_text()))


def multipod_example(steps: int | None = None, interval: int | None = None
                     ) -> dict[str, Any]:
    """The tiny example with one worker pod: the head runs only Ray and the driver.
    13Gi of host memory per node: the worker is planned at 11 GiB (its 6.3 GiB need, FSDP2's
    buffers counted, plus 4), so the HostOOM ladder's last rung (pod memory up to the
    node's allocatable, 12 GiB) has room; the head (9) and that worker fit the real node,
    and together request the 2 CPUs the head-only example does."""
    doc = example()
    doc["spec"]["resources"].update({"nodes": 1, "cpusPerNode": 1, "hostMemory": "13Gi"})
    if steps is not None:
        doc["spec"]["training"]["maxSteps"] = steps
    if interval is not None:
        doc["spec"]["checkpoint"]["intervalSteps"] = interval
    return doc


def disaggregated_example(steps: int | None = None) -> dict[str, Any]:
    """The tiny example with its rollouts apart (rollout.placement disaggregated): the
    head pod runs Ray, the driver and both ranks (resources.nodes 0, 1 CPU, labelled the
    training side), and one rollout pod (1 CPU) the transformers engine, which takes the
    weights from rank 0 after every update over gloo, between the two pods' addresses.
    Two pods of 1 CPU: the real node's 2. The head is planned at 12 GiB and the rollout
    pod at 8 (13Gi of host memory per node, as multipod_example)."""
    doc = example()
    doc["metadata"]["name"] = DISAGGREGATED_JOB
    doc["spec"]["resources"].update({"nodes": 0, "cpusPerNode": 1, "hostMemory": "13Gi"})
    doc["spec"]["rollout"] = {"placement": "disaggregated", "maxStaleness": 1,
                              "disaggregated": {"nodes": 1}}
    if steps is not None:
        doc["spec"]["training"]["maxSteps"] = steps
    return doc


@dataclass(frozen=True)
class Ended:
    """A pod's container as it ended (its first `terminated` state seen)."""

    pod: str
    role: Role
    reason: str
    exit_code: int | None


@dataclass
class TinyJob:
    tb: Testbed
    workdir: Path
    say: Callable[[str], None] = print
    name: str = JOB  # the GRPOJob's name (metadata.name of the doc applied)
    seen: list[dict[str, Any]] = field(default_factory=list)  # every job state observed
    # Every state of the job's pods observed while watching, by pod name, oldest first
    # (an ended attempt's pods are deleted with its RayCluster).
    pod_states: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @property
    def node(self) -> RealNode:
        assert self.tb.node is not None, "the tiny job needs the testbed's real node"
        return self.tb.node

    # ---- stages ----------------------------------------------------------------------

    def install_chart(self) -> None:
        """`helm install` of the chart: the operator runs in the cluster from its image,
        watching the job's namespace, with its admission webhook on."""
        self.tb.kubectl("create", "namespace", JOB_NS)
        wait_until(f"ServiceAccount default in {JOB_NS}", lambda: self.tb.kubectl(
            "get", "sa", "default", "-n", JOB_NS, check=False).returncode == 0, 30)
        sets = [a for k, v in CHART_VALUES.items() for a in ("--set", f"{k}={v}")]
        self.helm("install", RELEASE, str(CHART), "-n", OPERATOR_NS, "--create-namespace",
                  *sets, "--wait", "--timeout", "240s")

    def operator_log(self, tail: int = 200) -> str:
        out = self.tb.kubectl("logs", "-n", OPERATOR_NS, f"deploy/{OPERATOR_DEPLOYMENT}",
                              f"--tail={tail}", check=False)
        return out.stdout + out.stderr

    def build_assets(self) -> Path:
        """The tiny Qwen2.5-VL and an EasyR1-layout dataset on the claim the job mounts."""
        from grpo_testkit.datasets import write_vision_task
        from grpo_testkit.tiny_models import build_tiny_qwen2_5_vl
        from grpo_trainer.tiny import TINY_VL_HIDDEN

        spec = example()["spec"]
        claim = spec["model"]["claimName"]
        self.tb.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                       "metadata": {"name": claim, "namespace": JOB_NS},
                       "spec": {"accessModes": ["ReadOnlyMany"],
                                "resources": {"requests": {"storage": "1Gi"}}}})
        root = self.claim_dir(claim)
        model_dir = root / Path(spec["model"]["path"]).relative_to("/models")
        data = self.data_file()
        if not (model_dir / "config.json").exists():
            build_tiny_qwen2_5_vl(model_dir, hidden=TINY_VL_HIDDEN)
        data.parent.mkdir(parents=True, exist_ok=True)
        write_vision_task(data, rows=32)
        for path in [root, *root.rglob("*")]:  # safetensors writes 0600; pods run as 10001
            path.chmod(0o755 if path.is_dir() else 0o644)
        return root

    def claim_dir(self, claim: str) -> Path:
        """Where a claim of the job's namespace lives on the host."""
        assert self.node.claims is not None
        return self.node.claims.wait_path(JOB_NS, claim)

    def apply_job(self, doc: dict[str, Any]) -> Path:
        """`kubectl apply -f` of ``doc`` (the tiny example as changed), kept as a file."""
        manifest = self.workdir / "grpojob-tiny.yaml"
        manifest.write_text(yaml.safe_dump(doc, sort_keys=False))
        self.tb.kubectl("apply", "-n", JOB_NS, "-f", str(manifest))
        return manifest

    def job(self) -> dict[str, Any]:
        out = self.tb.kubectl("get", "grpojob", self.name, "-n", JOB_NS, "-o", "json")
        return dict(json.loads(out.stdout))

    def watch(self, until: Callable[[dict[str, Any]], bool], timeout_s: float,
              what: str) -> dict[str, Any]:
        """`kubectl get grpojobs -w` on screen while polling the job (and its pods) until
        ``until``."""
        with self._kubectl_watch():
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                job = self.job()
                if not self.seen or job["metadata"]["resourceVersion"] != \
                        self.seen[-1]["metadata"]["resourceVersion"]:
                    self.seen.append(job)
                self._observe_pods()
                if until(job):
                    return job
                time.sleep(0.5)
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}; "
                           f"status: {json.dumps(self.job().get('status'), indent=1)}\n"
                           f"operator log:\n{self.operator_log()}")

    def _observe_pods(self) -> None:
        out = self.tb.kubectl("get", "pods", "-n", JOB_NS, "-l", f"{JOB_LABEL}={self.name}",
                              "-o", "json", check=False)
        if out.returncode != 0:
            return
        for pod in json.loads(out.stdout)["items"]:
            states = self.pod_states.setdefault(pod["metadata"]["name"], [])
            if not states or states[-1]["metadata"]["resourceVersion"] != \
                    pod["metadata"]["resourceVersion"]:
                states.append(pod)

    @contextmanager
    def _kubectl_watch(self) -> Iterator[None]:
        proc = subprocess.Popen(
            [str(binary("kubectl")), "--kubeconfig", str(self.tb.kubeconfig), "get",
             "grpojobs", "-n", JOB_NS, "-w"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

        def pump() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                self.say("    " + line.rstrip())

        t = threading.Thread(target=pump, daemon=True)
        t.start()
        try:
            yield
        finally:
            proc.terminate()
            proc.wait(10)
            t.join(5)

    # ---- what the pods did -----------------------------------------------------------

    def pods(self, attempt: int | None = None, role: Role | None = None
             ) -> list[dict[str, Any]]:
        """The last state seen of each of the job's pods (of one attempt, one role)."""
        out = []
        for states in self.pod_states.values():
            labels = states[-1]["metadata"].get("labels") or {}
            if attempt is not None and labels.get(ATTEMPT_LABEL) != str(attempt):
                continue
            if role is not None and labels.get(ROLE_LABEL) != role.value:
                continue
            out.append(states[-1])
        return out

    def terminations(self, attempt: int) -> list[Ended]:
        """How each of one attempt's pods ended, as `kubectl get pods` first showed it."""
        ended: list[Ended] = []
        for name, states in self.pod_states.items():
            labels = states[-1]["metadata"].get("labels") or {}
            if labels.get(ATTEMPT_LABEL) != str(attempt):
                continue
            term = next((state["terminated"] for pod in states
                         for cs in pod.get("status", {}).get("containerStatuses") or []
                         for state in (cs.get("state") or {}, cs.get("lastState") or {})
                         if state.get("terminated")), None)
            if term is not None:
                ended.append(Ended(name, Role(str(labels.get(ROLE_LABEL))),
                                   str(term.get("reason")), term.get("exitCode")))
        return ended

    def kubectl_pods_wide(self) -> str:
        """`kubectl get pods -o wide`, with each pod's image: the job's and the operator's."""
        columns = ("NAME:.metadata.name,STATUS:.status.phase,IP:.status.podIP,"
                   "NODE:.spec.nodeName,IMAGE:.spec.containers[0].image")
        return "\n".join(self.tb.kubectl("get", "pods", "-n", ns, "-o",
                                         f"custom-columns={columns}").stdout.rstrip()
                         for ns in (JOB_NS, OPERATOR_NS))

    def kubectl_logs(self, pod: str, tail: int = 400) -> str:
        out = self.tb.kubectl("logs", "-n", JOB_NS, pod, f"--tail={tail}", check=False)
        return out.stdout

    def checkpoint_claim(self) -> str:
        spec = example()["spec"]
        return str(spec["checkpoint"].get("claimName") or f"{self.name}-checkpoints")

    def checkpoint_dir(self) -> Path:
        return self.claim_dir(self.checkpoint_claim()) / JOB_NS / self.name

    def kept_dir(self, attempt: int) -> Path:
        """Where status.attempts[attempt].logs says (`<claim>:<path in the claim>`)."""
        record = next(a for a in self.job()["status"]["attempts"] if a["index"] == attempt)
        claim, _, path = record["logs"].partition(":")
        return self.claim_dir(claim) / path

    def kept_logs(self, attempt: int) -> dict[str, str]:
        """Pod name -> what it kept on the checkpoint claim, where the attempt's record
        says; the attempt's events (ATTEMPT_EVENTS) are not a pod's."""
        return {f.name.removesuffix(".log"): f.read_text(errors="replace")
                for f in sorted(self.kept_dir(attempt).glob("*.log"))
                if f.name != ATTEMPT_EVENTS}

    def events(self) -> list[dict[str, Any]]:
        """The job's namespace's events, as the API server holds them now."""
        out = self.tb.kubectl("get", "events", "-n", JOB_NS, "-o", "json")
        return list(json.loads(out.stdout)["items"])

    def model_dir(self) -> Path:
        spec = example()["spec"]
        return self.claim_dir(spec["model"]["claimName"]) / \
            Path(spec["model"]["path"]).relative_to("/models")

    def data_file(self) -> Path:
        spec = example()["spec"]
        return self.claim_dir(spec["model"]["claimName"]) / \
            Path(spec["data"]["train"]).relative_to("/models")

    def exported_dir(self) -> Path:
        """The model the trainer exported when the job succeeded, where status.export says
        it is on the checkpoint claim."""
        export = self.job()["status"]["export"]
        return self.claim_dir(export["claimName"]) / export["path"]

    def head_log(self, attempt: int) -> str:
        """Everything the trainer of one attempt printed, over all its head pods (the real
        node's log archive outlives the pods)."""
        logs = self.node.logs
        assert logs is not None
        return "".join(logs.text(d) for d in logs.pods(JOB_NS, f"{self.name}-a{attempt}-head"))

    def worker_log(self, attempt: int) -> str:
        """Everything one attempt's worker pods printed (Ray's worker node; its ranks' own
        output goes to the driver's log too)."""
        logs = self.node.logs
        assert logs is not None
        names = {p["metadata"]["name"] for p in self.pods(attempt, Role.WORKER)}
        return "".join(logs.text(d) for d in logs.pods(JOB_NS)
                       if d.name.split("_")[1] in names)

    def helm(self, *args: str) -> str:
        return self.tb.helm(*args).stdout

    def teardown(self) -> None:
        self.tb.kubectl("delete", "grpojob", self.name, "-n", JOB_NS, "--ignore-not-found",
                        "--wait=true", "--timeout=60s", check=False)
        (self.workdir / "operator.log").write_text(self.operator_log(tail=-1))
        logs = self.tb.node.logs if self.tb.node is not None else None
        if logs is not None:  # the testbed's dir goes with it
            shutil.copytree(logs.archive, self.workdir / "pod-logs", dirs_exist_ok=True)
        self.tb.helm("uninstall", RELEASE, "-n", OPERATOR_NS, "--wait", "--timeout", "60s",
                     check=False)


@contextmanager
def tiny_job_testbed(workdir: Path, injections: tuple[EnvInjection, ...] = (),
                     name: str = JOB, with_kueue: bool = True,
                     with_registry: bool = True, with_s3: bool = True) -> Iterator[TinyJob]:
    """A testbed with its real node (the operator's and the CPU trainer's images imported)
    and the fault switch's ``injections``; the job and the chart are removed on exit."""
    with running_testbed(real_node=True, node_images=(OPERATOR.tag, TRAINER_CPU.tag),
                         injections=injections, with_kueue=with_kueue,
                         with_registry=with_registry, with_s3=with_s3) as tb:
        tj = TinyJob(tb, workdir, name=name)
        try:
            yield tj
        finally:
            tj.teardown()
