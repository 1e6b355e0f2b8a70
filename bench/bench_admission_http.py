"""One admission over HTTPS, as the API server calls it: the operator's admission process
(forked as the operator forks it) answering AdmissionReviews over one kept-alive TLS
connection, against the baseline of the same answer computed in this process (no HTTP,
no second process). The ratio is what serving costs per call; `--clients N` sends from N
threads at once, as the API server does during a burst of creates.

No Kubernetes API: the namespace reads fail at once and the review checks the spec alone
(the namespace reads are cached 5 s a namespace in the operator).

    .venv/bin/python bench/bench_admission_http.py [--calls 100] [--clients 1]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import ssl
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.modules.setdefault("kubernetes", None)  # type: ignore[arg-type]  # as the operator

from grpo_operator import kube  # noqa: E402
from grpo_operator.admission_process import AdmissionProcess  # noqa: E402
from grpo_operator.admission_review import review_answer  # noqa: E402
from grpo_operator.config import OperatorConfig, WebhookConfig  # noqa: E402
from grpo_operator.webhook import default_patch, validate  # noqa: E402
from grpo_testbed.examples import example_job  # noqa: E402
from grpo_testbed.pki import issue_serving_cert, make_pki  # noqa: E402
from grpo_testkit.kubeconfigs import unreachable_kubeconfig  # noqa: E402

EXAMPLE = "grpojob-qwen25vl-7b-h100.yaml"


def review(uid: int) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": str(uid), "operation": "CREATE", "namespace": "",
                        "object": example_job(EXAMPLE, "j")}}


def over_https(port: int, ca: Path, path: str, calls: int) -> list[float]:
    conn = http.client.HTTPSConnection("127.0.0.1", port,
                                       context=ssl.create_default_context(cafile=str(ca)))
    times = []
    for i in range(calls):
        body = json.dumps(review(i))
        t0 = time.perf_counter()
        conn.request("POST", path, body, {"Content-Type": "application/json"})
        answer_ = json.loads(conn.getresponse().read())
        times.append((time.perf_counter() - t0) * 1000)
        assert answer_["response"]["allowed"], answer_
    conn.close()
    return times


def in_process(config: OperatorConfig, path: str, calls: int) -> list[float]:
    """The same answer from the functions the admission process calls, in this process."""
    times = []
    for i in range(calls):
        request = review(i)
        obj = request["request"]["object"]
        t0 = time.perf_counter()
        if path == "/default-grpojob":
            review_answer(request, patch=default_patch(obj, "", config))
        else:
            found = validate(obj, None, "CREATE", "", config)
            review_answer(request, found.problem, warnings=found.warnings)
        times.append((time.perf_counter() - t0) * 1000)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--calls", type=int, default=100, help="calls per client and webhook")
    ap.add_argument("--clients", type=int, default=1)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-admission-"))
    pki = make_pki(work / "pki")
    cert, key = issue_serving_cert(pki, work / "webhook", "webhook")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    config = OperatorConfig(kubeconfig=str(unreachable_kubeconfig(work)), bind="127.0.0.1",
                            webhook=WebhookConfig(port=port, cert=str(cert), key=str(key),
                                                  ca=str(pki.ca_cert)))
    server = AdmissionProcess.start(config)
    kube.load_config(config.kubeconfig)  # the baseline's reads fail as the process's do
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the admission process never listened") from None
                time.sleep(0.1)
        print(f"load average {os.getloadavg()[0]:.2f}; {args.calls} calls x {args.clients} "
              f"client(s) per webhook; ms per call (median / p90)")
        print(f"{'webhook':20}{'in process':>16}{'HTTPS, process':>18}{'ratio':>8}")
        for path in ("/default-grpojob", "/validate-grpojob"):
            base = in_process(config, path, args.calls)
            with ThreadPoolExecutor(args.clients) as clients:
                runs = list(clients.map(over_https, [port] * args.clients,
                                        [pki.ca_cert] * args.clients,
                                        [path] * args.clients, [args.calls] * args.clients))
            served = [t for run in runs for t in run]
            b, s = statistics.median(base), statistics.median(served)
            print(f"{path:20}{b:>9.2f} / {sorted(base)[int(len(base) * .9)]:<5.2f}"
                  f"{s:>11.2f} / {sorted(served)[int(len(served) * .9)]:<5.2f}"
                  f"{s / b:>7.1f}x")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
