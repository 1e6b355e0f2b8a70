"""`grpo plan` and `grpo crd` as a user runs them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from grpo_operator.cli import cli
from grpo_operator.crd import crd_yaml

pytestmark = pytest.mark.unit
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
A100 = str(EXAMPLES / "grpojob-qwen25vl-7b-a100-40gb.yaml")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_plan_table_shows_decisions_memory_pods_and_env() -> None:
    code, out, _ = run("plan", A100)
    assert code == 0
    for text in (
        "Plan for GRPOJob qwen25vl-7b-a100",
        "gradientCheckpointing",
        "offloadParams",
        "rayObjectStoreMemory",
        "Predicted memory (GiB)",
        "GPU training",
        "host steady",
        "NVIDIA-A100-SXM4-40GB",
        "RAY_memory_usage_threshold",
    ):
        assert text in out, text


def test_plan_json_is_machine_readable() -> None:
    code, out, _ = run("plan", A100, "--output", "json")
    assert code == 0
    data = json.loads(out)
    assert data["cluster"]["worldSize"] == 8
    assert data["settings"]["offloadParams"] is False
    assert data["pods"]["worker"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"
    }
    assert data["settings"]["rank0Init"] is True
    assert data["env"]["TOKENIZERS_PARALLELISM"] == "false"


def test_plan_yaml() -> None:
    code, out, _ = run("plan", A100, "-o", "yaml")
    assert code == 0
    assert yaml.safe_load(out)["memory"]["peakHostGiB"] > 0


def test_plan_reads_config_json_below_model_root(tmp_path: Path) -> None:
    model = tmp_path / "models" / "tiny-qwen25vl"
    model.mkdir(parents=True)
    config = {
        "model_type": "qwen2", "hidden_size": 128, "intermediate_size": 256, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
    }  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    job = yaml.safe_load((EXAMPLES / "grpojob-tiny.yaml").read_text())
    del job["spec"]["model"]["shape"]
    f = tmp_path / "job.yaml"
    f.write_text(yaml.safe_dump(job))
    code, out, _ = run("plan", str(f), "-o", "json", "--model-root", str(tmp_path))
    assert code == 0, out
    assert json.loads(out)["model"]["layers"] == 3


def test_plan_bad_spec_exits_2_naming_the_field(tmp_path: Path) -> None:
    job = yaml.safe_load(Path(A100).read_text())
    job["spec"]["resources"]["gpuType"] = "H 900"  # malformed (unknown names: test_gpu_catalog)
    job["spec"]["memory"] = {"offloadParams": "yes"}
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(job))
    code, _, err = run("plan", str(f))
    assert code == 2
    assert "spec.resources.gpuType" in err
    assert "spec.memory.offloadParams: Input should be a valid boolean (write true or false" in err


def test_plan_infeasible_exits_2_with_numbers(tmp_path: Path) -> None:
    job = yaml.safe_load(Path(A100).read_text())
    job["spec"]["model"]["path"] = "Qwen/Qwen2.5-VL-72B-Instruct"
    job["spec"]["resources"].update({"gpusPerNode": 1})
    job["spec"]["training"]["globalBatchSize"] = 128
    f = tmp_path / "big.yaml"
    f.write_text(yaml.safe_dump(job))
    code, _, err = run("plan", str(f))
    assert code == 2
    assert "infeasible" in err and "GiB" in err and "smallest changes" in err


def test_crd_prints_and_writes(tmp_path: Path) -> None:
    code, out, _ = run("crd")
    assert code == 0 and out == crd_yaml()
    code, out, _ = run("crd", "--write", "--root", str(tmp_path))
    assert code == 0
    assert (tmp_path / "crds/grpojob.yaml").read_text() == crd_yaml()
    assert (tmp_path / "charts/grpo-operator/crds/grpojob.yaml").read_text() == crd_yaml()


def _file(tmp_path: Path, *docs: dict[str, object]) -> str:
    f = tmp_path / "jobs.yaml"
    f.write_text(yaml.safe_dump_all(list(docs)))
    return str(f)


def _a100(name: str, **resources: object) -> dict[str, object]:
    job = yaml.safe_load(Path(A100).read_text())
    job["metadata"] = {"name": name}
    job["spec"]["resources"].update(resources)
    return dict(job)


def test_plan_plans_every_grpojob_and_names_each_document_it_does_not(tmp_path: Path) -> None:
    queue = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "notes"}}
    f = _file(tmp_path, _a100("first"), queue, _a100("second", gpusPerNode=4))
    code, out, err = run("plan", f)
    assert code == 0, err
    assert "Plan for GRPOJob first" in out and "Plan for GRPOJob second" in out
    assert f"Warning: {f}: document 2 (kind ConfigMap, name notes) is not a GRPOJob; " \
           "not planned" in err
    code, out, _ = run("plan", f, "-o", "json")
    assert code == 0
    assert [p["cluster"]["worldSize"] for p in json.loads(out)] == [8, 4]
    code, out, _ = run("plan", f, "-o", "yaml")
    assert [p["cluster"]["worldSize"] for p in yaml.safe_load_all(out)] == [8, 4]


def test_plan_refuses_one_job_of_two_and_still_plans_the_other(tmp_path: Path) -> None:
    f = _file(tmp_path, _a100("fits"), _a100("too-many", gpusPerNode=16))
    code, out, err = run("plan", f)
    assert code == 2
    assert "Plan for GRPOJob fits" in out and "too-many" not in out
    assert (f"error: {f}: document 2 (GRPOJob too-many): GRPOJob is invalid:\n  "
            "spec.resources.gpusPerNode: 16 is more than the 8 GPUs a A100-40GB node has") in err


@pytest.mark.parametrize("name", ["Qwen-Job", "job_1", "1job", "j" * 49, "job-"])
def test_plan_refuses_the_names_the_crd_refuses(tmp_path: Path, name: str) -> None:
    """The CRD's metadata.name rule (a DNS-1035 label of at most 48 characters) holds
    for `grpo plan` too: the API server would refuse these before any plan."""
    code, out, err = run("plan", _file(tmp_path, _a100(name)))
    assert code == 2 and not out
    assert f"metadata.name: {name!r}: metadata.name must be at most 48 characters" in err


def test_plan_refuses_what_admission_refuses_after_planning(tmp_path: Path) -> None:
    """`grpo plan` runs the webhook's checks on the plan: here an env var the operator
    sets for the trainer, which admission refuses with the same message."""
    from grpo_operator.webhook import admission_problem

    job = _a100("clash")
    job["spec"]["pods"] = {"workers": {"env": [{"name": "GRPO_JOB_NAME", "value": "x"}]}}
    code, _, err = run("plan", _file(tmp_path, job))
    problem = admission_problem(job["spec"], None)  # type: ignore[arg-type]
    assert code == 2 and problem is not None
    assert "spec.pods.workers.env[0].name: GRPO_JOB_NAME is set by the operator" in problem
    assert problem in err
