"""Two operator replicas in one Kopf peering, as the chart runs them: the active one is
SIGKILLed mid-reconcile; the standby takes over, the job goes on with no attempt lost or
doubled, and admission answers all along (every replica serves it, behind one port as
behind the chart's Service)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_operator.peering import PEERING_LIFETIME_S
from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed
from grpo_testbed.operator_process import WEBHOOK_CONFIG, OperatorProcess
from grpo_testbed.processes import free_ports, wait_until

pytestmark = pytest.mark.cluster

PEERING_CRD = Path(__file__).resolve().parents[2] / "charts/grpo-operator/crds/kopf-peering.yaml"
RESUMED = "Resuming operations"  # Kopf's log line when a paused replica takes over


def kubectl_json(tb: Testbed, *args: str) -> Any:
    return json.loads(tb.kubectl("get", *args, "-o", "json").stdout)


def peers(tb: Testbed, ns: str) -> dict[str, Any]:
    return dict(kubectl_json(tb, "kopfpeering", "grpo", "-n", ns).get("status") or {})


def test_killing_the_active_replica_mid_reconcile_loses_and_doubles_nothing(
        testbed: Testbed, grpo_crd: Testbed, ns: str, tmp_path: Path) -> None:
    testbed.kubectl("apply", "--server-side", "-f", str(PEERING_CRD))
    testbed.kubectl("wait", "--for", "condition=established", "crd/kopfpeerings.kopf.dev")
    testbed.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump({
        "apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "grpo"}}))
    (port,) = free_ports(1)
    # No --priority: each replica derives its own (the older one reconciles), and the
    # peering lifetime is the operator's default, as the chart's.
    first, second = (OperatorProcess(testbed, tmp_path / n, namespaces=(ns,), webhook_port=port,
                                     extra_args=("--peering", "grpo"))
                     for n in ("first", "second"))
    try:
        first.start()
        second.start()
        wait_until("both replicas in the peering", lambda: len(peers(testbed, ns)) == 2, 60)
        prios = sorted(p["priority"] for p in peers(testbed, ns).values())
        assert prios[0] != prios[1]  # equal priorities would pause both
        # The younger replica stands by, and is healthy doing so (no kubelet restarts).
        wait_until("the second replica stands by",
                   lambda: second.healthz().startswith("standby:"), 30)
        assert first.healthz().startswith("ok:")

        testbed.kubectl("apply", "-n", ns, "-f", "-",
                        input=yaml.safe_dump(example_job("grpojob-tiny.yaml", "ha")))

        def clusters() -> list[str]:
            return sorted(r["metadata"]["name"]
                          for r in kubectl_json(testbed, "rayclusters", "-n", ns)["items"])

        # Mid-reconcile: the moment the active replica has created the attempt's cluster.
        wait_until("the active replica creates attempt 0's RayCluster", clusters, 60,
                   interval_s=0.05)
        first.kill()
        killed_at = time.monotonic()
        killed_in = kubectl_json(testbed, "grpojob", "ha", "-n", ns).get("status", {})

        # Admission while no replica reconciles: the standby refuses a bad job with the
        # webhook's own message (not "failed calling webhook").
        bad = example_job("grpojob-qwen25vl-7b-h100.yaml", "bad",
                          resources={"gpuType": "H100-80GB", "nodes": 1, "gpusPerNode": 16})
        out = testbed.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-",
                              input=yaml.safe_dump(bad), check=False)
        assert second.healthz().startswith("standby:")  # still standing by
        assert out.returncode != 0
        assert "spec.resources.gpusPerNode: 16 is more than the 8 GPUs" in out.stderr, out.stderr
        good = testbed.kubectl("apply", "--dry-run=server", "-n", ns, "-f", "-",
                               input=yaml.safe_dump(example_job("grpojob-tiny.yaml", "ok")))
        assert "created (server dry run)" in good.stdout

        wait_until("the standby takes over", lambda: second.healthz().startswith("ok:"),
                   PEERING_LIFETIME_S + 15, interval_s=0.1)
        failover_s = time.monotonic() - killed_at
        print(f"fail-over after SIGKILL: {failover_s:.1f} s (peering lifetime "
              f"{PEERING_LIFETIME_S} s; killed in phase {killed_in.get('phase')!r})")
        assert failover_s <= PEERING_LIFETIME_S + 5

        def phase() -> str:
            status = kubectl_json(testbed, "grpojob", "ha", "-n", ns).get("status", {})
            return str(status.get("phase", ""))

        try:
            wait_until("ha Running under the second replica", lambda: phase() == "Running", 60)
        except TimeoutError as exc:
            raise AssertionError(f"{exc}\nsecond replica:\n{second.log_tail()}") from None
        time.sleep(3)  # a doubled attempt would show by now
        status = kubectl_json(testbed, "grpojob", "ha", "-n", ns)["status"]
        assert clusters() == ["ha-a0"]
        assert status["attempt"] == 0 and [a["index"] for a in status["attempts"]] == [0]
        assert RESUMED in second.log.read_text()
    finally:
        # While an operator runs, a Running job carries Kopf's finalizer.
        testbed.kubectl("delete", "grpojobs", "--all", "-n", ns, "--wait=true",
                        "--timeout=60s", check=False)
        for op in (first, second):
            op.stop()
        # Without an operator the managed webhook would refuse every GRPOJob.
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            testbed.kubectl("delete", kind, WEBHOOK_CONFIG, "--ignore-not-found", check=False)


def test_a_renewed_webhook_certificate_makes_the_operator_restart_to_serve_it(
        grpo_crd: Testbed, ns: str, tmp_path: Path) -> None:
    """Kopf loads its serving certificate once; the files a renewal rewrites (cert-manager,
    the chart's rotation: a Secret volume) make the operator stop itself, saying why,
    for Kubernetes to start it with the new one. Unchanged files change nothing."""
    from grpo_testbed.pki import issue_serving_cert

    op = OperatorProcess(grpo_crd, tmp_path / "op", namespaces=(ns,),
                         extra_args=("--webhook-cert-check", "0.5")).start()
    try:
        assert op.proc is not None
        time.sleep(2)  # several looks at the same files
        assert op.proc.poll() is None, op.log_tail()
        assert grpo_crd.pki is not None
        issue_serving_cert(grpo_crd.pki, tmp_path / "op" / "webhook", "webhook")  # renewed
        op.proc.wait(30)
        log = op.log.read_text()
        assert "the webhook certificate" in log and "was renewed; restarting" in log, \
            op.log_tail()
    finally:
        op.stop()
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            grpo_crd.kubectl("delete", kind, WEBHOOK_CONFIG, "--ignore-not-found", check=False)


def test_an_operator_whose_admission_process_dies_stops_and_clears_its_webhooks(
        grpo_crd: Testbed, ns: str, tmp_path: Path) -> None:
    """The webhooks are served by a process of the operator's own (admission_process.py):
    while it answers, a bad spec is refused with the planner's words; once it is gone the
    operator stops, saying why, for Kubernetes to start both again, and takes its managed
    webhooks with it (else every GRPOJob write would be refused by a dead endpoint)."""
    op = OperatorProcess(grpo_crd, tmp_path / "op", namespaces=(ns,)).start()
    try:
        assert op.proc is not None
        bad = example_job("grpojob-qwen25vl-7b-h100.yaml", "bad")
        bad["spec"]["resources"]["gpusPerNode"] = 9
        refused = grpo_crd.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(bad),
                                   check=False)
        assert refused.returncode != 0 and "spec.resources.gpusPerNode" in refused.stderr
        children = Path(f"/proc/{op.proc.pid}/task/{op.proc.pid}/children").read_text().split()
        assert len(children) == 1, children  # the admission process
        os.kill(int(children[0]), signal.SIGKILL)
        assert op.proc.wait(60) is not None
        assert "the admission process ended (exit code -9)" in op.log.read_text(), \
            op.log_tail()
        hooks = kubectl_json(grpo_crd, "validatingwebhookconfiguration", WEBHOOK_CONFIG)
        assert not hooks.get("webhooks"), hooks
    finally:
        op.stop()
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            grpo_crd.kubectl("delete", kind, WEBHOOK_CONFIG, "--ignore-not-found", check=False)
