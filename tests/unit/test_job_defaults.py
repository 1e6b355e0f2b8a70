"""The platform's job defaults (the chart's jobDefaults, --job-defaults): every job in a
namespace inherits them where it sets nothing; the job's own fields win; admission,
reconcile and `grpo plan` apply them alike; status.plan.inherited names each one and
where it came from; the image and queue are recorded at creation."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from grpo_operator import reconcile as rec
from grpo_operator.config import OperatorConfig
from grpo_operator.job_defaults import (
    INHERITED_ANNOTATION,
    JobDefaults,
    parse_job_defaults,
    with_job_defaults,
)
from grpo_operator.reconcile import Observed
from grpo_operator.webhook import creation_defaults, review_admission
from grpo_testbed.chart import CHART, KUBE_VERSION, NS, helm, set_args
from grpo_testbed.examples import example_job
from grpo_testbed.status_patch import apply_status_patch

pytestmark = pytest.mark.unit

T0 = "2026-12-03T10:00:00.000Z"
GPU_TAINT = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
DEFAULTS: dict[str, Any] = {
    "image": "registry.platform/grpo/trainer:1.2",
    "tolerations": [GPU_TAINT],
    "nodeSelector": {"pool": "h100", "zone": "a"},
    "priorityClassName": "training",
    "storageClass": "lustre",
    "devices": {"rdma/ib": 1},
    "queueName": "shared",
    "namespaces": {"team-a": {"queueName": "team-a", "nodeSelector": {"zone": "b"}}},
}
PLATFORM = parse_job_defaults(json.dumps(DEFAULTS))
CONFIG = OperatorConfig(default_image="registry.example/trainer:op", job_defaults=PLATFORM)


def h100(**changes: Any) -> dict[str, Any]:
    doc = example_job("grpojob-qwen25vl-7b-h100.yaml", "j", **changes)
    doc["spec"]["checkpoint"] = {"size": "500Gi"}
    return doc


def test_a_job_that_sets_nothing_inherits_every_default_and_says_from_where() -> None:
    got = with_job_defaults(h100()["spec"], PLATFORM, "team-a")
    spec = got.raw_spec
    assert spec["image"] == DEFAULTS["image"] and spec["queueName"] == "team-a"
    common = spec["pods"]["common"]
    assert common["tolerations"] == [GPU_TAINT]
    assert common["nodeSelector"] == {"pool": "h100", "zone": "b"}  # the namespace's zone
    assert common["priorityClassName"] == "training"
    assert spec["checkpoint"]["storageClass"] == "lustre"
    assert spec["resources"]["devices"] == {"rdma/ib": 1}
    assert got.origins == {
        "spec.image": "jobDefaults", "spec.queueName": "jobDefaults.namespaces.team-a",
        "spec.pods.common.priorityClassName": "jobDefaults",
        "spec.pods.common.nodeSelector.pool": "jobDefaults",
        "spec.pods.common.nodeSelector.zone": "jobDefaults.namespaces.team-a",
        "spec.pods.common.tolerations": "jobDefaults",
        "spec.checkpoint.storageClass": "jobDefaults",
        "spec.resources.devices.rdma/ib": "jobDefaults",
    }
    # Another namespace gets only the entries for all.
    other = with_job_defaults(h100()["spec"], PLATFORM, "team-b").raw_spec
    assert other["queueName"] == "shared"
    assert other["pods"]["common"]["nodeSelector"] == {"pool": "h100", "zone": "a"}


def test_the_jobs_own_fields_win_and_its_data_is_kept() -> None:
    own_toleration = {"key": "spot", "operator": "Exists"}
    doc = h100(image="mine:1", queueName="q", pods={
        "common": {"tolerations": [own_toleration, GPU_TAINT], "nodeSelector": {"pool": "a100"}},
        "workers": {"priorityClassName": "urgent"}})
    doc["spec"]["checkpoint"]["storageClass"] = "fast"
    doc["spec"]["resources"]["devices"] = {"rdma/ib": 4}
    before = copy.deepcopy(doc["spec"])
    got = with_job_defaults(doc["spec"], PLATFORM, "team-a")
    assert doc["spec"] == before  # the job as written is never changed in place
    spec = got.raw_spec
    assert (spec["image"], spec["queueName"]) == ("mine:1", "q")
    common = spec["pods"]["common"]
    assert common["nodeSelector"] == {"pool": "a100", "zone": "b"}  # a key it did not set
    assert common["tolerations"] == [own_toleration, GPU_TAINT]  # no duplicate added
    assert "priorityClassName" not in common  # a role set one: the platform's stays out
    assert spec["checkpoint"]["storageClass"] == "fast"
    assert spec["resources"]["devices"] == {"rdma/ib": 4}
    assert got.origins == {"spec.pods.common.nodeSelector.zone": "jobDefaults.namespaces.team-a"}


def test_defaults_apply_only_where_they_mean_something() -> None:
    # An existing claim has its own class; a cpu job without workers has no device pods.
    tiny = example_job()
    tiny["spec"]["checkpoint"] = {"claimName": "ckpt"}
    spec = with_job_defaults(tiny["spec"], PLATFORM, "ns").raw_spec
    assert "storageClass" not in spec["checkpoint"]
    assert "devices" not in spec["resources"]
    assert review_admission(spec, None).problem is None
    # No defaults: the spec as written, nothing inherited.
    empty = with_job_defaults(h100()["spec"], JobDefaults.model_validate({}), "ns")
    assert empty.raw_spec == h100()["spec"] and empty.origins == {}


@pytest.mark.parametrize(("defaults", "words"), [
    ("{", "--job-defaults: not JSON"),
    ('{"tolerations": [{"operator": "Sometimes"}]}', "jobDefaults.tolerations.0.operator"),
    ('{"nodeSelector": {"pool": 3}}', "jobDefaults.nodeSelector.pool"),
    ('{"devices": {"nvidia.com/gpu": 1}}', "GPUs come from resources.gpuType"),
    ('{"namespaces": {"a": {"queue": "x"}}}', "jobDefaults.namespaces.a.queue"),
    ('{"priorityClassName": "Not A Name"}', "jobDefaults.priorityClassName"),
])
def test_bad_defaults_stop_the_operator_at_start_naming_the_field(defaults: str,
                                                                  words: str) -> None:
    from grpo_operator.main import cli

    with pytest.raises(ValueError, match=r"jobDefaults|--job-defaults"):
        parse_job_defaults(defaults)
    res = CliRunner().invoke(cli, ["--job-defaults", defaults])
    assert res.exit_code == 2 and words in res.output, res.output


def test_the_chart_passes_its_values_to_the_operator_as_the_operator_reads_them() -> None:
    out = helm("template", "grpo", str(CHART), "-n", NS, "--kube-version", KUBE_VERSION,
               *set_args({}), "--set-json", f"jobDefaults={json.dumps(DEFAULTS)}").stdout
    dep = next(d for d in yaml.safe_load_all(out) if d and d["kind"] == "Deployment")
    (arg,) = [a for a in dep["spec"]["template"]["spec"]["containers"][0]["args"]
              if a.startswith("--job-defaults=")]
    assert parse_job_defaults(arg.split("=", 1)[1]) == PLATFORM
    # The values schema knows the fields the operator takes, and no others.
    schema = json.loads((Path(__file__).parents[2] / "charts/grpo-operator/values.schema.json")
                        .read_text())["properties"]["jobDefaults"]
    fields = {f.alias or n for n, f in JobDefaults.model_fields.items()}
    assert set(schema["properties"]) == fields
    assert set(schema["properties"]["namespaces"]["additionalProperties"]["properties"]) \
        == fields - {"namespaces"}


def decide(doc: dict[str, Any], ns: str = "team-a") -> tuple[dict[str, Any], rec.Action]:
    doc = copy.deepcopy(doc)
    doc["metadata"] |= {"namespace": ns, "uid": "u1", "generation": 1, "resourceVersion": "1"}
    doc["status"] = {}
    action = rec.reconcile(doc, Observed(), rec.SpecChanged(), T0, CONFIG)
    doc["status"] = apply_status_patch(doc["status"], action.status)
    return doc, action


def test_the_ray_pods_and_the_claim_get_them_and_status_plan_names_them() -> None:
    doc = h100()
    created = creation_defaults(doc["spec"], {}, "team-a", CONFIG)  # the mutating webhook
    doc["spec"] |= created.spec
    doc["metadata"]["annotations"] = created.annotations
    job, action = decide(doc)
    assert job["status"]["phase"] != "Failed", job["status"]
    rc = next(c for c in action.children if c["kind"] == "RayCluster")
    assert rc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a"
    pods = [rc["spec"]["headGroupSpec"]["template"]["spec"],
            *(g["template"]["spec"] for g in rc["spec"]["workerGroupSpecs"])]
    for pod in pods:
        assert GPU_TAINT in pod["tolerations"]
        assert pod["priorityClassName"] == "training"
        assert pod["nodeSelector"]["pool"] == "h100" and pod["nodeSelector"]["zone"] == "b"
        assert pod["containers"][0]["image"] == DEFAULTS["image"]
    worker = rc["spec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"]["rdma/ib"] == "1"
    claim = next(c for c in action.children if c["kind"] == "PersistentVolumeClaim")
    assert claim["spec"]["storageClassName"] == "lustre"
    inherited = job["status"]["plan"]["inherited"]
    assert inherited["spec.image"] == "jobDefaults"  # recorded at creation
    assert inherited["spec.queueName"] == "jobDefaults.namespaces.team-a"
    assert inherited["spec.pods.common.tolerations"] == "jobDefaults"
    assert inherited["spec.resources.devices.rdma/ib"] == "jobDefaults"


def test_creation_records_image_and_queue_the_label_and_the_job_win() -> None:
    got = creation_defaults(h100()["spec"], {}, "team-b", CONFIG)
    assert got.spec == {"image": DEFAULTS["image"], "queueName": "shared"}
    assert json.loads(got.annotations[INHERITED_ANNOTATION]) == {
        "spec.image": "jobDefaults", "spec.queueName": "jobDefaults"}
    labelled = creation_defaults(h100(image="mine:1")["spec"],
                                 {"kueue.x-k8s.io/queue-name": "from-label"}, "team-b", CONFIG)
    assert labelled.spec == {"queueName": "from-label"} and labelled.annotations == {}
    plain = creation_defaults(h100()["spec"], {}, "x", OperatorConfig(default_image="op:1"))
    assert plain.spec == {"image": "op:1"} and plain.annotations == {}


def test_admission_checks_the_job_with_its_defaults() -> None:
    # A default that the job's own spec makes impossible is refused at apply, naming it.
    tiny = example_job()
    bad = parse_job_defaults(json.dumps({"nodeSelector": {"nvidia.com/gpu.product": "x"}}))
    spec = with_job_defaults(h100()["spec"], bad, "ns").raw_spec
    problem = review_admission(spec, None).problem
    assert problem and "nodeSelector" in problem, problem
    assert review_admission(with_job_defaults(tiny["spec"], PLATFORM, "ns").raw_spec,
                            None).problem is None


def test_grpo_plan_applies_them_for_the_namespace_and_names_each(tmp_path: Path) -> None:
    from grpo_operator.cli import cli

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(h100()))
    res = CliRunner().invoke(cli, ["plan", str(path), "--offline", "-o", "json",
                                   "--job-defaults", json.dumps(DEFAULTS), "-n", "team-a"])
    assert res.exit_code == 0, res.output
    assert "Inherited: spec.queueName from jobDefaults.namespaces.team-a" in res.stderr
    plan = json.loads(res.stdout)
    assert plan["pods"]["worker"]["devices"] == {"rdma/ib": 1}, plan["pods"]
    assert "IPC_LOCK" in plan["pods"]["worker"]["capabilities"]  # RDMA's, planned
