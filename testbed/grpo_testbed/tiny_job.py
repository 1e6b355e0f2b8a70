"""The main job end to end: chart, operator, and a tiny GRPOJob that really trains.

Shared by `grpo-testbed demo` (which narrates it) and the e2e tier (which asserts on
it). The testbed runs with its local node, so the job's head pod is a real process
tree: Ray's head, then the trainer driver with two gloo ranks. Attempt 0's head gets
``GRPO_FAULT_INJECT=host_oom@step=N`` from the node (a testbed fault switch, like
kwok's chaos stage), so the kernel OOM-kills it under the pod's memory limit and the
operator has a real OOMKilled pod to classify, remediate and resume from.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from grpo_api.contract import ATTEMPT_LABEL, ROLE_LABEL, TERMINAL_PHASES, Env, Role

from .faults import EnvInjection
from .images import TRAINER_CPU
from .launcher import Testbed, running_testbed
from .local_node.agent import LocalNodeAgent
from .operator_process import OperatorProcess
from .processes import wait_until
from .versions import binary

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "grpo-operator"
EXAMPLE = REPO / "examples" / "grpojob-tiny.yaml"
JOB_NS = "grpo-demo"
OPERATOR_NS = "grpo-system"
RELEASE = "grpo"
JOB = "tiny"
OOM_STEP = 5
TERMINAL = tuple(p.value for p in TERMINAL_PHASES)


def oom_injection(step: int = OOM_STEP) -> EnvInjection:
    """Only attempt 0's head: the restarted attempt must run clean."""
    return EnvInjection({ATTEMPT_LABEL: "0", ROLE_LABEL: Role.HEAD.value},
                        {Env.FAULT_INJECT.value: f"host_oom@step={step}"})


def example() -> dict[str, Any]:
    return dict(yaml.safe_load(EXAMPLE.read_text()))


def multipod_example(steps: int, interval: int) -> dict[str, Any]:
    """The tiny example with one worker pod: the head runs only Ray and the driver.
    13Gi of host memory per node: the worker is planned at 11 GiB (its 6.3 GiB need, FSDP2's
    buffers counted, plus 4), so the HostOOM ladder's last rung (pod memory up to the
    node's allocatable, 12 GiB) has room; the head (9) and that worker fit the real node,
    and together request the 2 CPUs the head-only example does."""
    doc = example()
    doc["spec"]["resources"].update({"nodes": 1, "cpusPerNode": 1, "hostMemory": "13Gi"})
    doc["spec"]["training"]["maxSteps"] = steps
    doc["spec"]["checkpoint"]["intervalSteps"] = interval
    return doc


@dataclass
class TinyJob:
    tb: Testbed
    workdir: Path
    say: Callable[[str], None] = print
    operator: OperatorProcess | None = None
    seen: list[dict[str, Any]] = field(default_factory=list)  # every job state observed

    @property
    def agent(self) -> LocalNodeAgent:
        assert self.tb.agent is not None, "the testbed runs without its local node"
        return self.tb.agent

    # ---- stages ----------------------------------------------------------------------

    def install_chart(self) -> None:
        """The chart with the operator's pod scaled to 0: the operator runs here, locally,
        as the chart's ServiceAccount (so the chart's RBAC is what it gets)."""
        self.tb.kubectl("create", "namespace", JOB_NS)
        wait_until(f"ServiceAccount default in {JOB_NS}", lambda: self.tb.kubectl(
            "get", "sa", "default", "-n", JOB_NS, check=False).returncode == 0, 30)
        self.helm("install", RELEASE, str(CHART), "-n", OPERATOR_NS, "--create-namespace",
                  "--set", "replicaCount=0", "--set", "webhook.enabled=false",
                  "--set", "leaderElection.enabled=false",
                  "--set", f"watchNamespaces={{{JOB_NS}}}", "--wait", "--timeout", "120s")

    def start_operator(self) -> None:
        account = f"{RELEASE}-grpo-operator"
        kc = self.tb.token_kubeconfig(account, OPERATOR_NS, self.workdir / "operator.kubeconfig")
        (self.workdir / "operator").mkdir(parents=True, exist_ok=True)
        # The real node runs the product's trainer image; the local agent runs this venv.
        image = ("--trainer-image", TRAINER_CPU.tag) if self.tb.node is not None else ()
        self.operator = OperatorProcess(self.tb, self.workdir / "operator", kubeconfig=kc,
                                        webhook=False, namespaces=(JOB_NS,),
                                        extra_args=image).start()

    def build_assets(self) -> Path:
        """The tiny Qwen2.5-VL and an EasyR1-layout dataset on the claim the job mounts."""
        from grpo_trainer.testing.datasets import write_vision_task
        from grpo_trainer.testing.tiny_models import build_tiny_qwen2_5_vl
        from grpo_trainer.tiny import TINY_VL_HIDDEN

        spec = example()["spec"]
        claim = spec["model"]["claimName"]
        self.tb.apply({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                       "metadata": {"name": claim, "namespace": JOB_NS},
                       "spec": {"accessModes": ["ReadOnlyMany"],
                                "resources": {"requests": {"storage": "1Gi"}}}})
        root = self.claim_dir(claim)
        model_dir = root / Path(spec["model"]["path"]).relative_to("/models")
        data = root / Path(spec["data"]["train"]).relative_to("/models")
        if not (model_dir / "config.json").exists():
            build_tiny_qwen2_5_vl(model_dir, hidden=TINY_VL_HIDDEN)
        data.parent.mkdir(parents=True, exist_ok=True)
        write_vision_task(data, rows=32)
        for path in [root, *root.rglob("*")]:  # safetensors writes 0600; pods run as 10001
            path.chmod(0o755 if path.is_dir() else 0o644)
        return root

    def claim_dir(self, claim: str) -> Path:
        """Where a claim of the job's namespace lives on the host."""
        node = self.tb.node
        if node is None:
            return self.agent.claim_dir(JOB_NS, claim)
        assert node.claims is not None
        return node.claims.wait_path(JOB_NS, claim)

    def apply_job(self, engine: str | None = None) -> None:
        """`kubectl apply -f examples/grpojob-tiny.yaml`; ``engine`` sets spec.rollout.engine."""
        if engine is None:
            self.tb.kubectl("apply", "-n", JOB_NS, "-f", str(EXAMPLE))
            return
        doc = example()
        doc["spec"]["rollout"] = {"engine": engine}
        manifest = self.workdir / f"grpojob-tiny-{engine}.yaml"
        manifest.write_text(yaml.safe_dump(doc))
        self.tb.kubectl("apply", "-n", JOB_NS, "-f", str(manifest))

    def job(self) -> dict[str, Any]:
        out = self.tb.kubectl("get", "grpojob", JOB, "-n", JOB_NS, "-o", "json")
        return dict(json.loads(out.stdout))

    def watch(self, until: Callable[[dict[str, Any]], bool], timeout_s: float,
              what: str) -> dict[str, Any]:
        """`kubectl get grpojobs -w` on screen while polling the job until ``until``."""
        with self._kubectl_watch():
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                job = self.job()
                if not self.seen or job["metadata"]["resourceVersion"] != \
                        self.seen[-1]["metadata"]["resourceVersion"]:
                    self.seen.append(job)
                if until(job):
                    return job
                time.sleep(0.5)
        raise TimeoutError(f"timed out after {timeout_s:.0f} s waiting for {what}; "
                           f"status: {json.dumps(self.job().get('status'), indent=1)}\n"
                           f"operator log:\n{self.operator.log_tail() if self.operator else ''}")

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

    # ---- where things are on the node --------------------------------------------------

    def checkpoint_dir(self) -> Path:
        spec = example()["spec"]
        claim = spec["checkpoint"].get("claimName") or f"{JOB}-checkpoints"
        return self.claim_dir(claim) / JOB_NS / JOB

    def model_dir(self) -> Path:
        spec = example()["spec"]
        return self.claim_dir(spec["model"]["claimName"]) / \
            Path(spec["model"]["path"]).relative_to("/models")

    def head_runs(self) -> dict[int, list[Path]]:
        """attempt -> the agent's directories of that attempt's head pods, in start order.

        An attempt can have more than one: KubeRay replaces a head whose container
        ended, and the replacement runs (briefly) until the operator deletes the cluster.
        """
        out: dict[int, list[Path]] = {}
        started = sorted((self.agent.workdir / "pods").glob(f"{JOB_NS}_*head*/containers/"
                                                            "ray-head/env.json"),
                         key=lambda p: p.stat().st_mtime)
        for env_file in started:
            attempt = int(json.loads(env_file.read_text()).get("GRPO_ATTEMPT", "-1"))
            out.setdefault(attempt, []).append(env_file.parents[2])
        return out

    def head_log(self, attempt: int) -> str:
        """Everything the trainer of one attempt printed, over all its head pods."""
        node = self.tb.node
        if node is not None:  # the real node: its log archive outlives the pods
            assert node.logs is not None
            return "".join(node.logs.text(d)
                           for d in node.logs.pods(JOB_NS, f"{JOB}-a{attempt}-head"))
        return "".join((d / "ray-head.log").read_text(errors="replace")
                       for d in self.head_runs().get(attempt, []))

    def export(self, out: Path) -> str:
        proc = subprocess.run(
            [sys.executable, "-m", "grpo_trainer", "export", "--checkpoint-dir",
             str(self.checkpoint_dir()), "--out", str(out), "--model-path", str(self.model_dir())],
            capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"export failed:\n{proc.stdout}\n{proc.stderr}")
        return proc.stdout.strip()

    def helm(self, *args: str) -> str:
        proc = subprocess.run([str(binary("helm")), *args], env=self.tb.env(),
                              capture_output=True, text=True, timeout=300, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc.stdout

    def teardown(self) -> None:
        self.tb.kubectl("delete", "grpojob", JOB, "-n", JOB_NS, "--ignore-not-found",
                        "--wait=true", "--timeout=60s", check=False)
        node = self.tb.node
        if node is not None and node.logs is not None:  # the testbed's dir goes with it
            shutil.copytree(node.logs.archive, self.workdir / "pod-logs", dirs_exist_ok=True)
        if self.operator is not None:
            self.operator.stop()
        subprocess.run([str(binary("helm")), "uninstall", RELEASE, "-n", OPERATOR_NS,
                        "--wait", "--timeout", "60s"], env=self.tb.env(),
                       capture_output=True, check=False)


@contextmanager
def tiny_job_testbed(workdir: Path, oom_step: int | None = OOM_STEP) -> Iterator[TinyJob]:
    """A testbed with its local node (and the OOM switch for attempt 0), ready for the job."""
    injections = (oom_injection(oom_step),) if oom_step else ()
    with running_testbed(local_node=True, injections=injections) as tb:
        tj = TinyJob(tb, workdir)
        try:
            yield tj
        finally:
            tj.teardown()
