"""The generated CRD on a real API server: examples, defaults, columns, explain, rejects."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import STALL_TIMEOUT_S
from grpo_api.job import GRPOJobSpec
from grpo_operator.crd import CRD_NAME
from grpo_testbed.examples import broken_job

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("grpojob-*.yaml"))
BROKEN = yaml.safe_load((Path(__file__).parent / "broken_grpojobs.yaml").read_text())


@pytest.fixture(scope="module")
def crd(testbed: Any) -> Any:
    testbed.install_grpojob_crd()
    return testbed


@pytest.fixture(scope="module")
def ns(crd: Any) -> str:
    return str(crd.namespace("crd"))


def get_json(tb: Any, *args: str) -> dict[str, Any]:
    return dict(json.loads(tb.kubectl("get", *args, "-o", "json").stdout))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_applies_and_reads_back_with_defaults(crd: Any, ns: str, path: Path) -> None:
    crd.kubectl("apply", "-n", ns, "-f", str(path))
    name = yaml.safe_load(path.read_text())["metadata"]["name"]
    stored = get_json(crd, "grpojob", name, "-n", ns)["spec"]
    # The API server filled the same defaults the pydantic models fill.
    assert stored == GRPOJobSpec.model_validate(stored, by_alias=True, by_name=False).to_wire()
    given = yaml.safe_load(path.read_text())["spec"].get("recovery", {})
    assert stored["restartPolicy"] == "OnFailure" and stored["backoffLimit"] >= 0
    assert stored["recovery"] == {  # what the example leaves out is defaulted
        "backoff": {"initialSeconds": 30, "maxSeconds": 600, **given.get("backoff", {})},
        "stallTimeoutSeconds": STALL_TIMEOUT_S,
        "remediate": True,
        "allowPrecisionChange": False,
        "restartBudgets": {},  # none: every class counts toward backoffLimit
    }
    assert stored["reward"]["type"] in ("math", "r1v", "function")
    assert "keep" in stored["checkpoint"] and "intervalSteps" in stored["checkpoint"]
    assert stored["suspend"] is False


def test_get_shows_printer_columns_and_status_values(crd: Any, ns: str) -> None:
    crd.kubectl("apply", "-n", ns, "-f", str(ROOT / "examples/grpojob-tiny.yaml"))
    status = {
        "status": {
            "phase": "Running",
            "restarts": 1,
            "plan": {
                "gpu": "cpu", "nodes": 0, "gpusPerNode": 2, "totalGpus": 2,
                "rank0Init": True, "offloadParams": False, "offloadOptimizer": False,
                "gradientCheckpointing": False, "microBatchSize": 2,
                "rolloutGpuMemoryUtilization": 0, "rolloutN": 2, "peakGpuGiB": 0,
                "peakHostGiB": 8.8, "placement": "colocated",
                "details": {"decisions": ["free-form"]},
            },
            "progress": {"step": 12, "totalSteps": 100, "rewardMean": 0.41},
        }
    }  # fmt: skip
    crd.kubectl(
        "patch", "grpojob", "tiny", "-n", ns, "--subresource=status", "--type=merge",
        "-p", json.dumps(status),
    )  # fmt: skip
    out = crd.kubectl("get", "gj", "-n", ns).stdout
    header, *rows = out.splitlines()
    assert header.split() == ["NAME", "PHASE", "GPUS", "PLACEMENT", "STEP", "TOTAL", "REWARD",
                              "RESTARTS", "AGE"]
    row = next(r for r in rows if r.startswith("tiny "))
    assert row.split()[:8] == ["tiny", "Running", "2", "colocated", "12", "100", "0.41", "1"]
    wide = crd.kubectl("get", "grpojobs", "-n", ns, "-o", "wide").stdout
    assert "MODEL" in wide.splitlines()[0] and "/models/tiny-qwen25vl" in wide
    stored = get_json(crd, "grpojob", "tiny", "-n", ns)["status"]["plan"]["details"]
    assert stored == {"decisions": ["free-form"]}  # preserved, not pruned


def test_explain_shows_descriptions(crd: Any) -> None:
    out = crd.kubectl("explain", "grpojob.spec.memory").stdout
    assert "Memory knobs" in out
    for field in ("offloadParams", "gradientCheckpointing", "rolloutGpuMemoryUtilization"):
        assert field in out
    assert "Auto when unset" in out
    deep = crd.kubectl("explain", "grpojob.spec.checkpoint.keep").stdout
    assert "Complete checkpoints kept" in deep


def test_at_least_fifteen_broken_manifests() -> None:
    assert len(BROKEN) >= 15


@pytest.mark.parametrize("case", BROKEN, ids=lambda c: c["name"])
def test_broken_manifest_is_rejected_naming_the_field(
    crd: Any, ns: str, case: dict[str, Any]
) -> None:
    result = crd.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(broken_job(case)),
                         check=False)  # fmt: skip
    assert result.returncode != 0, f"{case['name']} was accepted"
    assert case["field"] in result.stderr, result.stderr
    missing = crd.kubectl("get", "grpojob", f"broken-{case['name']}", "-n", ns, check=False)
    assert missing.returncode != 0


def test_the_documented_crd_upgrade_takes_the_crds_over_from_helm(crd: Any) -> None:
    """docs/deployment.md, "Upgrade": Helm created the CRDs (its field manager owns their
    fields) and never upgrades them; the documented `kubectl apply`, run as written from
    the repository root, replaces them with the chart's."""
    doc = (ROOT / "docs/deployment.md").read_text()
    line = next(ln for ln in doc.splitlines() if ln.startswith("kubectl apply --server-side"))
    args = [str(ROOT / a) if a.startswith("charts/") else a for a in line.split()[1:]]
    chart_crd = yaml.safe_load((ROOT / "charts/grpo-operator/crds/grpojob.yaml").read_text())
    older = json.loads(json.dumps(chart_crd))
    older["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"] = "older"
    crd.kubectl("replace", "--field-manager=helm", "-f", "-", input=yaml.safe_dump(older))
    plain = [a for a in args if a != "--force-conflicts"]
    assert "conflict" in crd.kubectl(*plain, check=False).stderr  # why the flag is there
    crd.kubectl(*args)
    schema = get_json(crd, "crd", CRD_NAME)["spec"]["versions"][0]["schema"]
    want = chart_crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["description"]
    assert schema["openAPIV3Schema"]["description"] == want
