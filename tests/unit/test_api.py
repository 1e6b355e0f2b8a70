"""GRPOJob API models: examples parse, bad input names the field and the fix."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.catalog import GPU_CATALOG
from grpo_api.job import SpecError, load_manifest, parse_manifest, parse_spec
from grpo_api.job.base import quantity_gib
from grpo_testbed.examples import broken_job

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("grpojob-*.yaml"))


def minimal() -> dict[str, Any]:
    return {
        "model": {"path": "Qwen/Qwen2.5-VL-7B-Instruct"},
        "data": {"train": "hiyouga/geometry3k@train"},
        "resources": {"gpuType": "H100-80GB", "nodes": 1},
        "checkpoint": {"size": "100Gi"},
    }


def test_the_four_examples_exist_and_parse() -> None:
    names = {p.name for p in EXAMPLES}
    assert {
        "grpojob-qwen25vl-7b-h100.yaml",
        "grpojob-qwen2vl-72b-h100.yaml",
        "grpojob-qwen25vl-7b-a100-40gb.yaml",
        "grpojob-tiny.yaml",
    } <= names
    for path in EXAMPLES:
        job = load_manifest(path)
        assert job.metadata["name"]


def test_defaults_are_filled_and_wire_form_is_camel_case() -> None:
    spec = parse_spec(minimal())
    wire = spec.to_wire()
    assert wire["algorithm"]["rolloutN"] == 5
    assert wire["checkpoint"] == {"size": "100Gi", "intervalSteps": 5, "keep": 2,
                                  "asyncSave": False, "retention": "Retain",
                                  "deleteClaimWithJob": False}
    assert wire["recovery"]["backoff"] == {"initialSeconds": 30, "maxSeconds": 600}
    assert (wire["restartPolicy"], wire["backoffLimit"]) == ("OnFailure", 3)
    assert wire["memory"] == {}  # every knob auto: unset
    assert spec.memory.offload_params is None


def test_every_catalog_name_fits_the_gpu_name_form() -> None:
    """resources.gpuType is a string checked against the catalog in use (webhook, planner);
    the schema checks only the form, which every built-in name must pass."""
    for name in GPU_CATALOG:
        assert parse_spec(_with("resources.gpuType", name)).resources.gpu_type == name


def _with(path: str, value: Any) -> dict[str, Any]:
    doc = minimal()
    *parents, leaf = path.split(".")
    node = doc
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return doc


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        ("resources.gpuType", "H100 80GB", "spec.resources.gpuType: String should match pattern"),
        ("resources.nodes", -1, "spec.resources.nodes: Input should be greater than or equal"),
        ("resources.nodes", "two", "spec.resources.nodes: Input should be a valid integer"),
        ("resources.nodes", 0, "nodes: must be at least 1 for a GPU type"),
        ("memory.microBatchSize", 0, "spec.memory.microBatchSize"),
        ("memory.offloadParams", "maybe", "spec.memory.offloadParams"),
        ("memory.rolloutGpuMemoryUtilization", 0.99, "spec.memory.rolloutGpuMemoryUtilization"),
        ("memory.rayObjectStoreMemory", "lots", "spec.memory.rayObjectStoreMemory"),
        ("checkpoint.keep", 0, "spec.checkpoint.keep"),
        ("checkpoint.claimName", "ckpt", "exactly one of claimName"),
        ("checkpoint.size", "ten gigs", "spec.checkpoint.size"),
        ("algorithm.rolloutN", 0, "spec.algorithm.rolloutN"),
        ("training.globalBatchSize", 100, "globalBatchSize: 100 must divide"),
        ("reward.type", "function", "function: required when type is function"),
        ("model.bogus", 1, "spec.model.bogus: unknown field; known fields: claimName, path"),
        ("memory.offload_params", True, "spec.memory.offload_params: unknown field"),
        ("data.maxPromptLength", 8, "spec.data.maxPromptLength"),
        ("data.overlongPrompts", "skip",
         "spec.data.overlongPrompts: Input should be 'drop' or 'fail'"),
    ],
)
def test_bad_input_names_the_field(path: str, value: Any, expected: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(_with(path, value))
    assert expected in str(err.value)


def test_missing_model_is_named() -> None:
    doc = minimal()
    del doc["model"]
    with pytest.raises(SpecError, match=r"spec\.model: required field is missing"):
        parse_spec(doc)


def test_manifest_checks_kind_and_api_version() -> None:
    with pytest.raises(SpecError, match="apiVersion"):
        parse_manifest({"apiVersion": "grpo.dev/v1", "kind": "GRPOJob", "spec": minimal()})
    job = parse_manifest({"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "spec": minimal()})
    assert job.spec.resources.gpu_type == "H100-80GB"


def test_a_yaml_file_without_a_grpojob_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "x.yaml"
    f.write_text("apiVersion: v1\nkind: ConfigMap\n")
    with pytest.raises(SpecError, match="no document of kind GRPOJob"):
        load_manifest(f)


@pytest.mark.parametrize(
    ("text", "gib"), [("760Gi", 760), ("1Ti", 1024), ("512Mi", 0.5), ("1.5Ti", 1536)]
)
def test_quantities(text: str, gib: float) -> None:
    assert quantity_gib(text) == pytest.approx(gib)


def test_status_round_trips() -> None:
    from grpo_api.job import GRPOJobStatus

    status = GRPOJobStatus.model_validate(
        {
            "observedGeneration": 2,
            "phase": "Running",
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "RayClusterReady",
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ],
            "progress": {"step": 12, "totalSteps": 100, "rewardMean": 0.41},
            "attempts": [{"index": 0, "outcome": "CudaOOM", "step": 12, "lastCheckpointStep": 10,
                          "remediation": "gradient checkpointing on"}],
        }
    )  # fmt: skip
    assert status.to_wire()["attempts"][0]["lastCheckpointStep"] == 10


BROKEN = yaml.safe_load((ROOT / "tests/cluster/broken_grpojobs.yaml").read_text())


@pytest.mark.parametrize("case", BROKEN, ids=lambda c: c["name"])
def test_models_reject_what_the_api_server_rejects(case: dict[str, Any]) -> None:
    """Same table as the cluster test: `grpo plan` and the API server agree."""
    with pytest.raises(SpecError) as err:
        parse_manifest(broken_job(case))
    leaf = case["field"].rsplit(".", 1)[-1]
    assert case["field"] in str(err.value) or f"{leaf}:" in str(err.value), str(err.value)


def test_the_crd_enums_are_the_contracts_phases_and_condition_types() -> None:
    """Declared once (grpo_api.contract): the CRD the API server enforces lists them."""
    from grpo_api.contract import ConditionType, Phase
    from grpo_operator.crd import open_api_schema

    status = open_api_schema()["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == [p.value for p in Phase]
    assert status["conditions"]["items"]["properties"]["type"]["enum"] == [
        c.value for c in ConditionType]


def test_every_spec_field_an_example_names_exists() -> None:
    """Examples (GRPOJobs and the queues a platform team applies) name spec fields in
    their comments: each is a real path of the GRPOJob schema."""
    from grpo_operator.crd import open_api_schema

    spec = open_api_schema()["properties"]["spec"]

    def exists(path: str) -> bool:
        node = spec
        for part in path.split("."):
            node = node.get("items", node)
            if part not in node.get("properties", {}):
                return False
            node = node["properties"][part]
        return True

    named = {(f.name, m) for f in (ROOT / "examples").glob("*.yaml")
             for m in re.findall(r"\bspec\.([A-Za-z]\w*(?:\.[A-Za-z]\w*)*)", f.read_text())}
    missing = sorted(n for n in named if not exists(n[1]))
    assert named and not missing, f"(example, spec path) not in the schema: {missing}"
