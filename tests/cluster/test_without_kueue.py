"""Most clusters have no Kueue: the operator starts and runs jobs there as before, and a
job that asks for a queue is refused at apply time instead of running unqueued."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import yaml

from grpo_testbed.build import BuildError
from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed, running_testbed
from grpo_testbed.operator_process import OPERATOR_NS_PREFIX, OperatorProcess
from grpo_testbed.processes import wait_until


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Testbed, OperatorProcess]]:
    """A testbed of its own without Kueue (no kueue.x-k8s.io API), and the operator."""
    try:
        with running_testbed(with_kueue=False) as tb:
            tb.install_grpojob_crd()
            op = OperatorProcess(tb, tmp_path_factory.mktemp("bare-operator")).start()
            try:
                yield tb, op
            finally:
                op.stop()
    except BuildError as exc:
        pytest.fail(f"the testbed could not be built: {exc}", pytrace=False)


def test_jobs_run_and_a_queue_is_refused_without_kueue(
        bare: tuple[Testbed, OperatorProcess]) -> None:
    tb, op = bare
    assert "kueue" not in tb.kubectl("api-versions").stdout
    ns = tb.namespace(OPERATOR_NS_PREFIX)
    tb.kubectl("apply", "-n", ns, "-f", "-",
               input=yaml.safe_dump(example_job("grpojob-tiny.yaml", "plain")))

    def phase() -> str:
        job = json.loads(tb.kubectl("get", "grpojob", "plain", "-n", ns, "-o", "json").stdout)
        return str((job.get("status") or {}).get("phase"))

    try:
        wait_until("plain job Running", lambda: phase() == "Running", 90)
    except TimeoutError as exc:
        raise AssertionError(f"{exc}: {phase()}\n{op.log_tail()}") from None
    queued = example_job("grpojob-tiny.yaml", "queued", queueName="grpo")
    out = tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(queued), check=False)
    assert out.returncode != 0
    assert "spec.queueName" in out.stderr and "Kueue is not installed" in out.stderr
    assert op.proc is not None and op.proc.poll() is None  # no Workload API: still serving
