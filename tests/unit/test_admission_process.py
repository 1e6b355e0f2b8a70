"""The admission process for real: forked by an operator-like parent, it answers
AdmissionReviews over TLS with the planner's words and the creation defaults, and it ends
when its parent is SIGKILLed (nobody left to answer for). The Kubernetes API is
unreachable here: the review then checks the spec alone, as it says in its log."""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from grpo_operator.admission_process import RECONCILE_NICENESS
from grpo_testbed.examples import example_job
from grpo_testbed.pki import Pki, issue_serving_cert, make_pki
from grpo_testkit.kubeconfigs import unreachable_kubeconfig

pytestmark = pytest.mark.unit

DEFAULT_IMAGE = "registry.example/trainer:op"

PARENT = textwrap.dedent("""
    import logging, sys, time
    sys.modules["kubernetes"] = None  # as the operator's process does (__main__.py)
    from grpo_operator.admission_process import AdmissionProcess
    from grpo_operator.config import OperatorConfig, WebhookConfig
    logging.basicConfig(level=logging.INFO)
    port, cert, key, ca, kubeconfig, image = sys.argv[1:]
    config = OperatorConfig(default_image=image, kubeconfig=kubeconfig, bind="127.0.0.1",
                            webhook=WebhookConfig(port=int(port), cert=cert, key=key, ca=ca))
    child = AdmissionProcess.start(config)
    print(child.process.pid, flush=True)
    time.sleep(600)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def admission(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, int, Pki]]:
    pki = make_pki(tmp_path / "pki")
    cert, key = issue_serving_cert(pki, tmp_path / "webhook", "webhook")
    kubeconfig = unreachable_kubeconfig(tmp_path)
    port = _free_port()
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(port), str(cert), str(key), str(pki.ca_cert),
         str(kubeconfig), DEFAULT_IMAGE],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, "the admission process never listened"
            time.sleep(0.1)
    yield parent, child, port, pki
    parent.kill()
    parent.wait()
    if _alive(child):
        os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _post(port: int, pki: Pki, path: str, review: dict[str, Any]) -> dict[str, Any]:
    context = ssl.create_default_context(cafile=str(pki.ca_cert))  # the caBundle's CA
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}",
                                     json.dumps(review).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, context=context, timeout=30) as rsp:
        return dict(json.loads(rsp.read()))


def _review(obj: dict[str, Any], operation: str = "CREATE") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "operation": operation, "namespace": "team-a",
                        "object": obj, "oldObject": None,
                        "userInfo": {"username": "alice"}}}


def test_the_operator_yields_the_cpu_to_it(
        admission: tuple[subprocess.Popen[str], int, int, Pki]) -> None:
    # A create waits on the webhooks; the reconciles in the operator's process can wait.
    parent, child, _, _ = admission
    assert (os.getpriority(os.PRIO_PROCESS, parent.pid)
            == os.getpriority(os.PRIO_PROCESS, child) + RECONCILE_NICENESS)


def test_it_refuses_a_bad_spec_naming_the_field_and_admits_a_good_one(
        admission: tuple[subprocess.Popen[str], int, int, Pki]) -> None:
    _, _, port, pki = admission
    bad = example_job("grpojob-qwen25vl-7b-h100.yaml", "j")
    bad["spec"]["resources"]["gpusPerNode"] = 9
    answer = _post(port, pki, "/validate-grpojob", _review(bad))["response"]
    assert answer["uid"] == "u-1" and answer["allowed"] is False
    assert answer["status"]["code"] == 422, answer
    assert "spec.resources.gpusPerNode" in answer["status"]["message"]

    good = _post(port, pki, "/validate-grpojob", _review(example_job()))["response"]
    assert good == {"uid": "u-1", "allowed": True}, good


def test_it_records_the_trainer_image_at_creation(
        admission: tuple[subprocess.Popen[str], int, int, Pki]) -> None:
    _, _, port, pki = admission
    job = example_job()
    job["spec"].pop("image", None)
    answer = _post(port, pki, "/default-grpojob", _review(job))["response"]
    assert answer["allowed"] is True and answer["patchType"] == "JSONPatch"
    assert json.loads(base64.b64decode(answer["patch"])) == [
        {"op": "add", "path": "/spec/image", "value": DEFAULT_IMAGE}]


def test_an_unknown_path_is_not_found_and_names_the_served_ones(
        admission: tuple[subprocess.Popen[str], int, int, Pki]) -> None:
    _, _, port, pki = admission
    with pytest.raises(urllib.error.HTTPError) as err:
        _post(port, pki, "/mutate-pods", _review(example_job()))
    assert err.value.code == 404
    assert "/validate-grpojob" in str(err.value.reason)


def test_it_ends_when_its_parent_is_killed(
        admission: tuple[subprocess.Popen[str], int, int, Pki]) -> None:
    parent, child, _, _ = admission
    assert _alive(child)
    parent.kill()
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(child), "the admission process outlived the operator's"


ENDS_BEFORE_LISTENING = textwrap.dedent("""
    import asyncio, socket, sys
    sys.modules["kubernetes"] = None
    from grpo_operator.admission_process import AdmissionProcess, until_listening
    from grpo_operator.config import OperatorConfig, WebhookConfig
    held = socket.socket()
    held.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
    port = held.getsockname()[1]
    cert, key, ca, kubeconfig = sys.argv[1:]
    config = OperatorConfig(kubeconfig=kubeconfig, bind="127.0.0.1",
                            webhook=WebhookConfig(port=port, cert=cert, key=key, ca=ca))
    child = AdmissionProcess.start(config)
    try:
        asyncio.run(until_listening(child, "127.0.0.1", port, timeout_s=30))
    except RuntimeError as exc:
        print("REFUSED:", exc)
""")


def test_a_port_it_cannot_take_stops_the_start_saying_so(tmp_path: Path) -> None:
    """The operator writes managed webhook configurations only once its admission process
    listens; a process that ended first (a port another process holds) is named, with its
    exit code, instead of configurations that would refuse every write."""
    pki = make_pki(tmp_path / "pki")
    cert, key = issue_serving_cert(pki, tmp_path / "webhook", "webhook")
    kubeconfig = unreachable_kubeconfig(tmp_path)
    out = subprocess.run([sys.executable, "-c", ENDS_BEFORE_LISTENING, str(cert), str(key),
                          str(pki.ca_cert), str(kubeconfig)],
                         capture_output=True, text=True, timeout=120)
    assert "REFUSED: the admission process ended (exit code 1) before it listened on " \
           "port" in out.stdout, out.stdout + out.stderr
    assert "address already in use" in out.stderr.lower(), out.stderr
