"""A fabric job whose NCCL crossed nodes over sockets shows the FabricFallback condition
(pure): the ranks' transport report (status.progress.transport, parsed from NCCL's own
log lines) against the fabrics the plan requested (status.plan.fabrics)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import Reason
from grpo_api.job import GRPOJobStatus, parse_spec
from grpo_operator import reconcile as rec
from grpo_operator.planner import plan_memory
from grpo_operator.planner.report import plan_status
from grpo_operator.reconcile import Action
from grpo_operator.reconcile.conditions import fabric_conditions
from grpo_operator.reconcile.stored import wire
from grpo_testbed.status_patch import apply_status_patch
from grpo_trainer.cluster.nccl_log import parse_transport
from grpo_trainer.liveness.progress import Progress

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
T0, T1 = "2026-11-29T00:00:00Z", "2026-11-29T00:05:00Z"
# One rank's NCCL log when the image lacks the verbs stack (NVIDIA/nccl#226's lines).
FELL_BACK = """\
w-3:45361:45361 [0] NCCL INFO NET/IB : No device found.
w-3:45361:45361 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.3.7<0>
w-3:45361:45361 [0] NCCL INFO Using network Socket
w-3:45361:45402 [7] NCCL INFO Channel 00/0 : 7[7] -> 8[0] [send] via NET/Socket/0
""".splitlines()
OVER_IB = [
    "w-3:924:1160 [5] NCCL INFO Using network IB",
    "w-3:924:1160 [5] NCCL INFO Channel 02/0 : 13[5] -> 5[5] [receive] via NET/IB/1/GDRDMA",
]


def plan(devices: dict[str, int] | None, nodes: int = 8) -> dict[str, Any]:
    spec = yaml.safe_load((ROOT / "examples/grpojob-qwen2vl-72b-h100.yaml").read_text())["spec"]
    spec["resources"] = {"gpuType": "H100-80GB", "nodes": nodes, "gpusPerNode": 8,
                         **({"devices": devices} if devices else {})}
    return plan_status(plan_memory(parse_spec(spec))).to_wire()  # as the operator writes it


def reported(lines: list[str], attempt: int = 0) -> dict[str, Any]:
    """status.progress after the driver's real report, merged as the API server does."""
    transport = {**parse_transport(lines).to_dict(), "attempt": attempt}
    body = Progress(1, 10, 0.1, None, updated_at=T0, transport=transport).to_status()
    return apply_status_patch({}, {"progress": body})["progress"]  # type: ignore[no-any-return]


def fabric_report(progress: dict[str, Any], plan: dict[str, Any],
                  conditions: list[dict[str, Any]] | None,
                  now: str) -> list[dict[str, Any]] | None:
    """fabric_conditions on the status as stored, its answer as written."""
    status = rec.read_status({"progress": progress, "plan": plan,
                              "conditions": conditions}).status
    new = fabric_conditions(status.progress, status.plan, status.conditions, 1, now)
    return None if new is None else wire(new)  # type: ignore[no-any-return]


def fabric(conds: list[dict[str, Any]] | None) -> dict[str, Any]:
    return next(c for c in conds or [] if c["type"] == "FabricFallback")


def test_an_infiniband_job_over_sockets_shows_the_fallback_and_its_cause() -> None:
    ib = plan({"rdma/ib": 1})
    assert ib["fabrics"] == ["infiniband"]
    new = fabric_report(reported(FELL_BACK), ib, [], T0)
    c = fabric(new)
    assert (c["status"], c["reason"]) == ("True", Reason.SOCKET_FALLBACK)
    assert "request infiniband devices" in c["message"]
    assert "NET/IB : No device found." in c["message"] and "libibverbs.so.1" in c["message"]
    GRPOJobStatus.model_validate({"conditions": new})  # what the CRD schema accepts
    assert fabric_report(reported(FELL_BACK), ib, new, T1) is None  # written once
    over = fabric(fabric_report(reported(OVER_IB), ib, new, T1))
    assert (over["status"], over["reason"]) == ("False", Reason.FABRIC_IN_USE)
    assert over["lastTransitionTime"] == T1 and "over IB" in over["message"]


def test_nothing_applies_without_a_requested_fabric_a_second_node_or_a_report() -> None:
    assert fabric_report(reported(FELL_BACK), plan(None), [], T0) is None
    assert fabric_report(reported(FELL_BACK), plan({"rdma/ib": 1}, nodes=1), [],
                             T0) is None
    assert fabric_report({"step": 3}, plan({"rdma/ib": 1}), [], T0) is None


def test_a_later_attempts_report_keeps_the_first_attempts_transport() -> None:
    """Only the first attempt reads NCCL's log: the reports after leave it in place."""
    status = apply_status_patch({}, {"progress": {"transport": {"network": "Socket"}}})
    later = Progress(5, 10, 0.2, 4, updated_at=T1).to_status()
    assert "transport" not in later
    assert apply_status_patch(status, {"progress": later})["progress"]["transport"] == {
        "network": "Socket"}


def test_the_report_is_a_warning_event_once_through_reconcile() -> None:
    from tests.unit.test_reconcile import running_job, step

    job = running_job()
    job["spec"]["resources"] = {"gpuType": "H100-80GB", "nodes": 2, "gpusPerNode": 8,
                                "devices": {"rdma/ib": 1}}
    job["status"]["plan"] = plan({"rdma/ib": 1}, nodes=2)
    job["status"]["progress"] = reported(FELL_BACK)
    job, action = step(job, rec.JobChanged())
    assert fabric(job["status"]["conditions"])["status"] == "True"
    assert [e[:2] for e in action.events] == [("Warning", Reason.SOCKET_FALLBACK)]
    assert step(job, rec.JobChanged())[1] == Action()
