"""The generated CRD: checked-in copies match, and the schema is one the API server takes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api import contract
from grpo_operator.crd import CRD_PATHS, crd, crd_yaml, write_crds

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("rel", CRD_PATHS)
def test_checked_in_crd_matches_generated(rel: str) -> None:
    assert (ROOT / rel).read_text() == crd_yaml(), f"{rel} is stale: run `grpo crd --write`"


def test_write_crds_writes_both_identical(tmp_path: Path) -> None:
    paths = write_crds(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in paths] == list(CRD_PATHS)
    assert paths[0].read_text() == paths[1].read_text()


def test_names_come_from_the_contract() -> None:
    c = crd()
    names = c["spec"]["names"]
    assert c["metadata"]["name"] == f"{contract.PLURAL}.{contract.API_GROUP}"
    assert c["spec"]["group"] == contract.API_GROUP
    assert (names["kind"], names["plural"], names["singular"], names["shortNames"]) == (
        contract.KIND, contract.PLURAL, contract.SINGULAR, [contract.SHORT_NAME]
    )  # fmt: skip
    version = c["spec"]["versions"][0]
    assert version["name"] == contract.API_VERSION
    assert version["subresources"] == {"status": {}}
    assert c["spec"]["scope"] == "Namespaced"


def test_printer_columns() -> None:
    cols = crd()["spec"]["versions"][0]["additionalPrinterColumns"]
    shown = [c["name"] for c in cols if not c.get("priority")]
    assert shown == ["Phase", "GPUs", "Placement", "Step", "Total", "Reward", "Restarts",
                     "Age"]
    placement = next(c for c in cols if c["name"] == "Placement")
    assert placement["jsonPath"] == ".status.plan.placement"


def _walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = []
    if isinstance(node, dict):
        out.append((path, node))
        for k, v in node.get("properties", {}).items():
            out.extend(_walk(v, f"{path}.{k}"))
        if isinstance(node.get("items"), dict):
            out.extend(_walk(node["items"], f"{path}[]"))
    return out


def test_schema_is_structural_and_documented() -> None:
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    text = yaml.safe_dump(schema)
    for forbidden in ("$ref", "anyOf", "oneOf", "allOf", "title:", "$defs"):
        assert forbidden not in text
    for path, node in _walk(schema):
        assert "type" in node or node.get("x-kubernetes-preserve-unknown-fields"), path
        if path and path != ".metadata":  # the server allows only `type` on metadata
            assert node.get("description"), f"{path} has no description"
        if "properties" in node:
            assert "additionalProperties" not in node, path
        for key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert isinstance(node.get(key, True), bool), path


def test_preserve_unknown_fields_only_for_plan_details_and_kubernetes_own_types() -> None:
    """Affinity and volume sources are Kubernetes' own (large) types, passed to the pod;
    status.modelConfig.config holds config.json's fields as the model's authors wrote them;
    spec.trainer lets a planned setting written there reach the webhook, which names the
    spec field that sets it (its known fields are typed all the same); spec.reward.kwargs
    are the user's function's keyword arguments, whatever it takes; spec.restartPolicy is
    a string now and an object in manifests written before (renames.py)."""
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    free = [p for p, n in _walk(schema) if n.get("x-kubernetes-preserve-unknown-fields")]
    pods = [f".spec.pods.{s}.{f}" for s in ("common", "head", "workers")
            for f in ("volumes[]", "affinity", "topologySpreadConstraints[]")]
    assert sorted(free) == sorted([*pods, ".spec.trainer", ".spec.reward.kwargs",
                                   ".spec.restartPolicy",
                                   ".status.plan.details",
                                   ".status.modelConfig.config"])


def test_cross_field_rules_are_cel() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert any("globalBatchSize" in r and "rolloutN" in r for r in rules)
    ckpt = [r["rule"] for r in spec["properties"]["checkpoint"]["x-kubernetes-validations"]]
    assert ("has(self.store) ? !(has(self.claimName) && has(self.size)) "
            ": has(self.claimName) != has(self.size)") in ckpt
    assert spec["properties"]["checkpoint"]["properties"]["keep"]["minimum"] == 1


def test_memory_knobs_are_auto_and_sections_default() -> None:
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    memory = spec["properties"]["memory"]
    assert memory["default"] == {}
    for name, node in memory["properties"].items():
        assert "default" not in node, name
        assert node["description"].startswith("Auto when unset"), name
    assert set(spec["required"]) == {"model", "data", "resources", "checkpoint"}
    gpu = spec["properties"]["resources"]["properties"]["gpuType"]
    assert "enum" not in gpu and gpu["pattern"]  # any catalog name, checked by the webhook


def test_configuration_doc_lists_every_spec_field() -> None:
    doc = (ROOT / "docs/configuration.md").read_text()
    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    # pods.head and pods.workers have the fields of pods.common, documented once.
    paths = {p.replace(".pods.head", ".pods.common").replace(".pods.workers", ".pods.common")
             for p, _ in _walk(spec)}
    missing = sorted(p for p in paths if p and f"`{p[1:]}`" not in doc)
    assert not missing, f"docs/configuration.md lacks {missing}"


def test_every_field_of_the_trainers_progress_patch_is_in_the_crds_schema() -> None:
    """A field the schema lacks would be pruned by the API server without a word: every
    key the trainer's report sends, each one set, is a property of status.progress and
    parses into ProgressStatus."""
    from grpo_api.job.status import ProgressStatus
    from grpo_trainer.checkpointing.dcp import upload_wire
    from grpo_trainer.driver.measured_peaks import PeakTracker
    from grpo_trainer.liveness.progress import Progress

    peaks = PeakTracker(0)
    peaks.observe(3, {"memory/gpu_rollout_card_peak_bytes": 2**34,
                      "memory/gpu_training_card_peak_bytes": 2**35,
                      "memory/host_rss_bytes": 2**31, "memory/driver/host_rss_bytes": 2**30})
    report = Progress(3, 10, 0.5, 2, memory_growth="grew", val_reward_mean=0.25, val_step=2,
                      save_seconds=1.5, bad_rows=4,
                      transport={"network": "Socket", "intraNode": [], "interNode": True,
                                 "causes": [], "attempt": 0},
                      measured_peaks=peaks.to_status(),
                      checkpoint_upload=upload_wire("Retrying", 2, 7, 41.26, "503 Slow Down")
                      ).to_status()
    schema = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
    progress = schema["status"]["properties"]["progress"]["properties"]
    assert set(report) <= set(progress), set(report) - set(progress)
    assert progress["badRows"]["type"] == "integer" and progress["badRows"]["minimum"] == 0
    measured = report["measuredPeaks"]
    assert isinstance(measured, dict)
    assert set(measured) == set(progress["measuredPeaks"]["properties"]), measured
    parsed = ProgressStatus.model_validate(report)
    assert parsed.bad_rows == 4
    assert parsed.checkpoint_upload is not None and (
        parsed.checkpoint_upload.state, parsed.checkpoint_upload.waited_seconds) == (
            "Retrying", 41.3)
    assert parsed.measured_peaks is not None and parsed.measured_peaks.gpu_gib == {
        "rollout": 16.0, "training": 32.0}
