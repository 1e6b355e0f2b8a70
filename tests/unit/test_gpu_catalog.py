"""Any GPU type: the effective catalog (built-in merged with the chart's gpuCatalog) is
what the planner, the webhook and reconcile accept; an unknown name is refused with the
known ones listed, and a bad catalog file stops the operator with the field named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from grpo_api.catalog import GPU_CATALOG
from grpo_api.job.status import GRPOJobStatus
from grpo_operator.catalog_file import CatalogError, load_catalog, merge_catalog
from grpo_operator.reconcile import StoredStatus
from grpo_operator.reconcile.attempts import ensure_attempt as reconcile
from grpo_operator.reconcile.planning import Planner
from grpo_operator.render import JobRef
from grpo_operator.webhook import admission_problem

pytestmark = pytest.mark.unit

MI300X = {"memoryGiB": 191.5, "productLabel": "AMD-Instinct-MI300X", "hostMemoryGiB": 2048,
          "cpus": 192, "gpusPerNode": 8}


def job(gpu: str, **resources: Any) -> dict[str, Any]:
    return {
        "model": {"path": "Qwen/Qwen2.5-VL-7B-Instruct"},
        "data": {"train": "/data/t.parquet", "maxPromptLength": 1024, "maxResponseLength": 1024},
        "training": {"rolloutBatchSize": 64, "globalBatchSize": 64},
        "resources": {"gpuType": gpu, **resources},
        "checkpoint": {"size": "100Gi"},
    }


def worker_of(spec: dict[str, Any], catalog: Any = GPU_CATALOG) -> dict[str, Any]:
    d = reconcile(JobRef("j", "ns", "u"), Planner(spec, catalog).plan([], None), GRPOJobStatus(),
                  "2026-01-01T00:00:00Z", "img")
    rc = next(c for c in d.children if c["kind"] == "RayCluster")
    return dict(rc["spec"]["workerGroupSpecs"][0]["template"]["spec"])


@pytest.mark.parametrize("gpu", ["L4-24GB", "A10G-24GB", "H20-96GB", "B200-180GB"])
def test_new_built_in_types_plan_and_select_their_nodes(gpu: str) -> None:
    pod = worker_of(job(gpu))
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": GPU_CATALOG[gpu].product_label}
    assert pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "8"


def test_webhook_refuses_an_unknown_type_and_lists_the_known_ones() -> None:
    problem = admission_problem(job("MI300X-192GB"), None)
    assert problem is not None
    assert "spec.resources.gpuType: unknown GPU type 'MI300X-192GB'" in problem
    assert "H100-80GB" in problem and "B200-180GB" in problem and "gpuCatalog" in problem


def test_a_type_the_chart_adds_is_admitted_planned_and_selected() -> None:
    catalog = merge_catalog({"MI300X-192GB": MI300X})
    assert admission_problem(job("MI300X-192GB"), None, catalog) is None
    pod = worker_of(job("MI300X-192GB"), catalog)
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "AMD-Instinct-MI300X"}


def test_reconcile_without_the_webhook_fails_an_unknown_type_as_invalid_spec() -> None:
    planned = Planner(job("MI300X-192GB")).plan([], None)
    d = reconcile(JobRef("j", "ns", "u"), planned, GRPOJobStatus(), "2026-01-01T00:00:00Z")
    d.derive(StoredStatus(), 1, "2026-01-01T00:00:00Z")
    assert d.status["phase"] == "Failed" and not d.children
    failed = next(c for c in d.status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec" and "known types: H100-80GB" in failed["message"]


def test_an_override_changes_what_the_planner_sizes_for() -> None:
    """gpuCatalog {H100-80GB: {hostMemoryGiB: 256}}: smaller hosts, smaller pods."""
    small = merge_catalog({"H100-80GB": {"hostMemoryGiB": 256, "cpus": 64}})
    big, little = worker_of(job("H100-80GB", nodes=1)), worker_of(job("H100-80GB", nodes=1), small)
    limit = lambda pod: pod["containers"][0]["resources"]["limits"]  # noqa: E731
    assert limit(little)["cpu"] == str(int(64 * 0.9)) != limit(big)["cpu"]
    assert int(limit(little)["memory"].removesuffix("Gi")) <= 256 * 0.95


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"X1": {"memoryGiB": 10}}, "gpuCatalog.X1: a new GPU type needs productLabel, "
                                    "hostMemoryGiB, cpus, gpusPerNode"),
        ({"H100-80GB": {"memoryGiB": "lots"}}, "gpuCatalog.H100-80GB.memoryGiB: Input should be"),
        ({"H100-80GB": {"hostMemGiB": 1}}, "gpuCatalog.H100-80GB.hostMemGiB: Extra inputs"),
        ({"H100-80GB": {"cpus": 0}}, "gpuCatalog.H100-80GB.cpus: Input should be greater"),
        ({"cpu": {"cpus": 8}}, "gpuCatalog.cpu: the cpu pseudo-type cannot be overridden"),
        ({"h100 80gb": MI300X}, "gpuCatalog: 'h100 80gb' is not a GPU type name"),
    ],
)
def test_bad_overrides_name_the_entry_and_field(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(CatalogError) as err:
        merge_catalog(overrides)
    assert message in str(err.value)


def test_the_chart_file_is_read_empty_or_not(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("{}\n")  # what the chart renders for gpuCatalog: {}
    assert load_catalog(empty) == GPU_CATALOG
    added = tmp_path / "added.yaml"
    added.write_text(yaml.safe_dump({"MI300X-192GB": MI300X}))
    assert load_catalog(added)["MI300X-192GB"].memory_gib == 191.5


def test_operator_refuses_to_start_on_a_bad_catalog(tmp_path: Path) -> None:
    from grpo_operator.main import cli

    bad = tmp_path / "gpu-catalog.yaml"
    bad.write_text(yaml.safe_dump({"X1": {"memoryGiB": 10}}))
    result = CliRunner().invoke(cli, [], env={"GRPO_GPU_CATALOG": str(bad)})
    assert result.exit_code == 2
    assert "gpuCatalog.X1: a new GPU type needs productLabel" in result.output


def test_grpo_plan_reads_the_same_catalog(tmp_path: Path) -> None:
    from grpo_operator.cli import cli

    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump({"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
                                        "metadata": {"name": "m"}, "spec": job("MI300X-192GB")}))
    refused = CliRunner().invoke(cli, ["plan", str(manifest)])
    assert refused.exit_code == 2
    assert "spec.resources.gpuType: unknown GPU type 'MI300X-192GB'" in refused.output
    catalog = tmp_path / "gpu-catalog.yaml"
    catalog.write_text(yaml.safe_dump({"MI300X-192GB": MI300X}))
    ok = CliRunner().invoke(cli, ["plan", str(manifest), "-o", "json", "--gpu-catalog",
                                  str(catalog)])
    assert ok.exit_code == 0, ok.output
    assert '"MI300X-192GB"' in ok.output
