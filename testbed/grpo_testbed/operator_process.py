"""`grpo-operator` as a local process against the testbed, as the chart would run it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from .launcher import Testbed
from .pki import issue_serving_cert
from .processes import die_with_parent, free_ports, wait_until

OPERATOR_NS_PREFIX = "op"  # the operator under test watches only namespaces op-*
WEBHOOK_CONFIG = "grpo.dev"


class OperatorProcess:
    """`grpo-operator` as a local process against the testbed (what the chart runs)."""

    def __init__(self, tb: Testbed, workdir: Path, kubeconfig: Path | None = None,
                 webhook: bool = True, extra_args: tuple[str, ...] = (),
                 namespaces: tuple[str, ...] = (f"{OPERATOR_NS_PREFIX}-*",),
                 env: dict[str, str] | None = None, webhook_port: int | None = None) -> None:
        """webhook=False runs without admission, as under the chart's ServiceAccount
        (which may not manage webhook configurations); `env` is added to ours.
        `webhook_port`: one port for several replicas, as the chart's webhook Service is
        (Kopf listens with SO_REUSEPORT: the kernel spreads connections over the live
        replicas, and a dead one's socket is gone with it)."""
        self.env = {**os.environ, **(env or {})}
        self.webhook = webhook
        self.extra_args = extra_args
        self.namespaces = namespaces
        self.tb = tb
        self.workdir = workdir
        self.kubeconfig = kubeconfig or tb.kubeconfig
        self.metrics_port, own_port = free_ports(2)
        self.webhook_port = webhook_port or own_port
        assert tb.pki is not None
        self.ca = tb.pki.ca_cert
        self.cert, self.key = issue_serving_cert(tb.pki, workdir / "webhook", "webhook")
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = workdir / "operator.log"

    def start(self) -> OperatorProcess:
        argv = [
            sys.executable, "-m", "grpo_operator",
            "--kubeconfig", str(self.kubeconfig), "--bind", "127.0.0.1",
            *(a for ns in self.namespaces for a in ("--namespace", ns)),
            "--metrics-port", str(self.metrics_port),
            # The testbed sends nothing past its own namespaces and loopback: a job that
            # names a hub model plans from the table unless it names spec.hub.endpoint.
            "--no-read-public-hub", *self.extra_args,
        ]
        argv += [] if not self.webhook else [
            "--webhook-port", str(self.webhook_port), "--webhook-host", "127.0.0.1",
            "--webhook-manage", WEBHOOK_CONFIG, "--webhook-cert", str(self.cert),
            "--webhook-key", str(self.key), "--webhook-ca", str(self.ca),
        ]
        with open(self.log, "ab") as out:
            # Dies with whoever started it, like every testbed process.
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                         env=self.env, start_new_session=True,
                                         preexec_fn=die_with_parent)
        wait_until("operator /healthz", lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{self.metrics_port}/healthz", timeout=2).status == 200, 60)
        if self.webhook:
            wait_until("operator webhook configuration", self._webhook_ready, 60)
        return self

    def _webhook_ready(self) -> bool:
        out = self.tb.kubectl("get", "validatingwebhookconfiguration", WEBHOOK_CONFIG,
                              check=False)
        return out.returncode == 0

    def metrics(self) -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics",
                                      timeout=5).read().decode()

    def healthz(self) -> str:
        """/healthz's answer, healthy or not (its text says why)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/healthz",
                                        timeout=5) as rsp:
                return str(rsp.read().decode())
        except urllib.error.HTTPError as exc:
            return str(exc.read().decode())

    def kill(self) -> None:
        """SIGKILL: no cleanup, like a node dying under the operator."""
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, n: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
