"""Hubs a job may read: the platform lists them by name (the chart's hubEndpoints,
--hub-endpoints), a job names one or writes one of their URLs, and anything else is
refused at apply with the names it may use; nothing reads an unlisted hub (no SSRF
through spec.hub.endpoint); the pods and the operator's own read get the listed URL."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from click.testing import CliRunner

from grpo_api.job.status import GRPOJobStatus
from grpo_api.model_config import hub_config_url
from grpo_operator import reconcile as rec
from grpo_operator.config import OperatorConfig
from grpo_operator.hub_endpoints import parse_hub_endpoints, readable
from grpo_operator.reconcile import HubAnswer, Observed
from grpo_operator.webhook import review_admission
from grpo_testbed.examples import example_job
from grpo_testbed.status_patch import apply_status_patch

pytestmark = pytest.mark.unit

T0 = "2026-12-03T10:00:00.000Z"
MIRROR = "https://hf-mirror.internal/api"
HUBS = {"mirror": MIRROR, "proxy": "http://hub-proxy.platform:8080"}
CONFIG = OperatorConfig(default_image="registry.example/trainer:test", hub_endpoints=HUBS)
PRIVATE = "acme/custom-vl-3b"  # read by the reader pod, with the job's token


def job(endpoint: str | None, **hub: Any) -> dict[str, Any]:
    doc = example_job("grpojob-qwen25vl-7b-h100.yaml", "j")
    doc["spec"]["hub"] = {**({"endpoint": endpoint} if endpoint else {}), **hub}
    doc["metadata"] |= {"namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "1"}
    return {**doc, "status": {}}


def decide(doc: dict[str, Any], observed: Observed | None = None,
           config: OperatorConfig = CONFIG) -> tuple[dict[str, Any], rec.Action]:
    action = rec.reconcile(doc, observed or Observed(), rec.SpecChanged(), T0, config)
    out = copy.deepcopy(doc)
    out["status"] = apply_status_patch(out["status"], action.status)
    return out, action


def head_env(action: rec.Action) -> dict[str, str]:
    rc = next(c for c in action.children if c["kind"] == "RayCluster")
    init = rc["spec"]["headGroupSpec"]["template"]["spec"]["initContainers"][0]
    return {e["name"]: e.get("value") for e in init["env"]}


@pytest.mark.parametrize(("text", "words"), [
    ("mirror", "not JSON"),
    ('["https://hf-mirror.internal"]', "a JSON object of names to URLs"),
    ('{"Mirror": "https://hf-mirror.internal"}', "name 'Mirror' is not a DNS label"),
    ('{"mirror": "hf-mirror.internal"}', "mirror: 'hf-mirror.internal' is not an http(s) URL"),
    ('{"mirror": 3}', "mirror: 3 is not an http(s) URL"),
])
def test_a_bad_list_stops_the_operator_at_start_naming_the_flag(text: str, words: str) -> None:
    from grpo_operator.main import cli

    with pytest.raises(ValueError, match="--hub-endpoints"):
        parse_hub_endpoints(text)
    res = CliRunner().invoke(cli, ["--hub-endpoints", text])
    assert res.exit_code == 2 and "--hub-endpoints" in res.output and words in res.output, \
        res.output


@pytest.mark.parametrize("endpoint", ["mirror", MIRROR, MIRROR + "/"])
def test_a_listed_hub_is_admitted_by_name_or_by_its_url(endpoint: str) -> None:
    review = review_admission(job(endpoint)["spec"], None, hub_endpoints=HUBS)
    assert review.problem is None, review.problem


@pytest.mark.parametrize(("endpoint", "what"), [
    ("http://169.254.169.254/latest/meta-data", "the URL 'http://169.254.169.254/latest"),
    ("https://kubernetes.default.svc", "the URL 'https://kubernetes.default.svc'"),
    ("https://hf-mirror.internal", "the URL 'https://hf-mirror.internal'"),  # not /api
    ("mirrors", "the name 'mirrors'"),
])
def test_an_unlisted_hub_is_refused_at_apply_with_the_names_to_use(endpoint: str,
                                                                  what: str) -> None:
    problem = review_admission(job(endpoint)["spec"], None, hub_endpoints=HUBS).problem
    assert problem is not None and problem.startswith("GRPOJob is invalid:"), problem
    assert f"spec.hub.endpoint: {what}" in problem
    assert "is not one of the cluster's hub endpoints (mirror, proxy)" in problem
    assert "Fix: set spec.hub.endpoint to one of mirror, proxy" in problem
    assert "the chart's hubEndpoints" in problem


def test_without_a_list_no_hub_may_be_named_and_the_fix_says_what_to_do() -> None:
    problem = review_admission(job(MIRROR)["spec"], None).problem
    assert problem is not None and "(it lists none)" in problem
    assert "Fix: remove spec.hub.endpoint" in problem and "readPublicHub" in problem
    assert review_admission(job(None)["spec"], None).problem is None


def test_a_stored_job_whose_hub_was_delisted_still_takes_metadata_updates() -> None:
    """A finalizer or label change carries the same spec: never blocked, or the job could
    not even be deleted."""
    spec = job("mirror")["spec"]
    assert review_admission(spec, copy.deepcopy(spec)).problem is None
    changed = copy.deepcopy(spec) | {"backoffLimit": 5}
    assert "spec.hub.endpoint" in str(review_admission(changed, spec).problem)


def test_the_pods_and_the_operators_read_get_the_listed_url() -> None:
    # The head's fetch: HF_ENDPOINT is the URL, never the name.
    _, action = decide(job("mirror"))
    assert head_env(action)["HF_ENDPOINT"] == MIRROR
    # The operator's own GET of a public repo's config.json: at the listed URL.
    public = job("mirror")
    public["spec"]["model"] = {"path": PRIVATE}
    read = readable(public["spec"], HUBS)
    assert read is not None and rec.operator_reads_hub(read, GRPOJobStatus(), read_public_hub=False)
    assert rec.hub_url(read) == hub_config_url(MIRROR, PRIVATE, None)
    # A private repo: the reader pod GETs the listed URL with the job's token.
    private = job("proxy", tokenSecret="hf-token")
    private["spec"]["model"] = {"path": PRIVATE}
    _, action = decide(private)
    (pod,) = [c for c in action.children if c["kind"] == "Pod"]
    command = pod["spec"]["containers"][0]["command"]
    assert command[command.index("--url") + 1] == hub_config_url(HUBS["proxy"], PRIVATE, None)


def test_a_job_naming_a_hub_no_longer_listed_fails_unread_naming_the_field() -> None:
    """Stored before the platform removed it (or while the webhook was away): the job
    fails with InvalidSpec, nothing is created and the handler reads nothing."""
    doc = job("https://attacker.example/hub")
    doc["spec"]["model"] = {"path": PRIVATE}
    assert readable(doc["spec"], HUBS) is None  # the handler's guard: no GET
    out, action = decide(doc, Observed(hub=HubAnswer("unused", error="never read")))
    assert out["status"]["phase"] == "Failed", out["status"]
    failed = next(c for c in out["status"]["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec"
    assert "spec.hub.endpoint: the URL 'https://attacker.example/hub'" in failed["message"]
    assert not action.children
