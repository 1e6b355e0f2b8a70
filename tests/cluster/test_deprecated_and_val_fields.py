"""On a real API server with the operator's webhook: a job that still sets the deprecated
spec.data.workers is accepted with a warning kubectl prints; valIntervalSteps without
data.val is refused by the CRD's own rule."""

from __future__ import annotations

from typing import Any

import yaml

from grpo_testbed.examples import example_job
from grpo_testbed.launcher import Testbed
from grpo_testbed.operator_process import OperatorProcess


def apply(tb: Testbed, ns: str, doc: dict[str, Any]) -> Any:
    return tb.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(doc), check=False)


def test_data_workers_is_accepted_with_a_warning(
    testbed: Testbed, operator: OperatorProcess, op_ns: str
) -> None:
    res = apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "legacy", data__workers=8))
    assert res.returncode == 0, res.stderr
    assert "Warning: spec.data.workers is deprecated and ignored" in res.stderr
    clean = apply(testbed, op_ns, example_job("grpojob-tiny.yaml", "clean"))
    assert clean.returncode == 0 and "deprecated" not in clean.stderr


def test_val_interval_without_a_val_split_is_refused_naming_the_field(
    testbed: Testbed, operator: OperatorProcess, op_ns: str
) -> None:
    res = apply(testbed, op_ns,
                example_job("grpojob-tiny.yaml", "noval", training__valIntervalSteps=2))
    assert res.returncode != 0
    assert "valIntervalSteps" in res.stderr and "data.val" in res.stderr
