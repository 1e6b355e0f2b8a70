"""Kueue's ResourceFlavors for the GPU catalog, and the testbed's Kueue wiring (pure)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grpo_api.catalog import GPU_CATALOG
from grpo_api.job import parse_spec
from grpo_operator.kueue_flavors import CPU_FLAVOR, resource_flavors
from grpo_operator.reconcile import planned
from grpo_operator.render import JobRef, render_children
from grpo_testbed.kueue import webhooks_by_url

EXAMPLES = sorted(p for p in (Path(__file__).resolve().parents[2] / "examples").glob(
    "grpojob-*.yaml") if "gpuType: cpu" not in p.read_text())
QUEUES = Path(__file__).resolve().parents[2] / "examples" / "kueue-queues.yaml"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_each_jobs_workers_match_exactly_their_gpu_types_flavor(example: Path) -> None:
    """Kueue assigns a flavor only if its node labels agree with the pod's nodeSelector:
    a job's worker pods must fit its own GPU type's flavor and no other type's."""
    spec = parse_spec(yaml.safe_load(example.read_text())["spec"])
    plan = planned(spec)
    rc = next(c for c in render_children(spec, plan, JobRef("j", "ns", "u"), 0)
              if c["kind"] == "RayCluster")
    group = (rc["spec"].get("workerGroupSpecs") or [{"template": rc["spec"]["headGroupSpec"][
        "template"]}])[0]
    selector = group["template"]["spec"].get("nodeSelector") or {}
    fitting = [f["metadata"]["name"] for f in resource_flavors(GPU_CATALOG)[1:]
               if all(selector.get(k) == v for k, v in f["spec"]["nodeLabels"].items())]
    assert fitting == [spec.resources.gpu_type.lower()], (selector, fitting)


def test_every_gpu_type_has_a_flavor_and_the_example_queue_names_only_real_ones() -> None:
    flavors = resource_flavors(GPU_CATALOG)
    names = [f["metadata"]["name"] for f in flavors]
    assert names[0] == CPU_FLAVOR and "spec" not in flavors[0]  # CPU/memory: any node
    assert len(names) == 1 + sum(g.is_gpu for g in GPU_CATALOG.values())
    cq = next(d for d in yaml.safe_load_all(QUEUES.read_text()) if d["kind"] == "ClusterQueue")
    used = {f["name"] for g in cq["spec"]["resourceGroups"] for f in g["flavors"]}
    assert used <= set(names), used - set(names)


def test_only_kueues_own_and_the_raycluster_webhooks_are_registered_by_url() -> None:
    manifests = [{"kind": "MutatingWebhookConfiguration",
                  "metadata": {"name": "mutating-webhook-configuration"}, "webhooks": [
                      {"name": n, "clientConfig": {"service": {"name": "s", "path": p}}}
                      for n, p in (("mjob.kb.io", "/mutate-batch-v1-job"),
                                   ("mraycluster.kb.io", "/mutate-ray-io-v1-raycluster"),
                                   ("mworkload.kb.io",
                                    "/mutate-kueue-x-k8s-io-v1beta2-workload"))]}]
    out = webhooks_by_url(manifests, "https://127.0.0.1:9443", b"CA")
    hooks = out[0]["webhooks"]
    assert [h["name"] for h in hooks] == ["mraycluster.kb.io", "mworkload.kb.io"]
    assert hooks[0]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate-ray-io-v1-raycluster", "caBundle": "Q0E="}
    assert out[0]["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    assert manifests[0]["webhooks"][0]["clientConfig"]["service"]  # input left as it was
