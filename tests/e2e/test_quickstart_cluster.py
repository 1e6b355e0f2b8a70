"""docs/quickstart-cluster.md, run as its script: every ```bash block of the walkthrough, in
order and as written, on the testbed with its real node and its own image registry.

The walkthrough pushes the images to the registry, installs the chart from it with
`global.imageRegistry`, puts a model and a dataset on a claim with `kubectl cp`, tries a
reward that reads a column and the image (`grpo-train score-reward`), plans, applies and
waits, reads the ended attempt, copies the exported model back, and then scores a second
job with a judge served in the job's namespace. The only things set beyond the page are
its three variables (REGISTRY: the testbed's registry; TRAINER: the CPU trainer image;
WORK: a temp dir) and the testbed's own settings (its kubeconfig, kubectl and helm on
PATH, podman's settings for this machine, its plain-HTTP registry marked insecure for
podman, no hub). The node already holds the images (imported as every e2e module's node
does), so its pulls from the registry fetch manifests and configs, not the layers again:
tests/e2e/test_registry_push.py proves a pull of every layer with a store of its own.
The registry's store is kept between runs (registry.py, ``start_registry``): podman still
pushes for real, and sends only the layers that store lacks (the first run sends them all).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from grpo_testbed.images import OPERATOR, TRAINER_CPU, podman_env
from grpo_testbed.launcher import Testbed, running_testbed
from grpo_testbed.tiny_job import REPO
from grpo_testbed.versions import binary, cache_root

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]

DOC = REPO / "docs" / "quickstart-cluster.md"
BLOCK = re.compile(r"^```bash\n(.*?)^```$", re.M | re.S)
NS = "ml"


def walkthrough_blocks() -> list[str]:
    """The page's ```bash blocks, in order (```sh blocks are shown, not run)."""
    return BLOCK.findall(DOC.read_text())


@dataclass
class Walkthrough:
    tb: Testbed
    env: dict[str, str]
    work: Path
    outputs: list[str] = field(default_factory=list)  # each block's stdout + stderr
    seconds: list[float] = field(default_factory=list)

    def job(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.tb.kubectl("get", "grpojob", name, "-n", NS, "-o",
                                               "json").stdout))

    def output_of(self, command: str) -> str:
        """The output of the (first) block that runs ``command``."""
        for block, out in zip(walkthrough_blocks(), self.outputs, strict=False):
            if command in block:
                return out
        raise AssertionError(f"no block of {DOC.name} runs {command!r}")


def insecure_registry_conf(path: Path, registry: str) -> Path:
    """The testbed's registry speaks plain HTTP: podman must be told so (a platform's
    registry has TLS and needs nothing of this)."""
    path.write_text(f'[[registry]]\nlocation = "{registry}"\ninsecure = true\n')
    return path


@pytest.fixture(scope="module")
def walk(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walkthrough]:
    tmp = tmp_path_factory.mktemp("quickstart")
    with running_testbed(real_node=True, node_images=(OPERATOR.tag, TRAINER_CPU.tag),
                         registry_store=cache_root() / "registry-quickstart") as tb:
        tools = sorted({str(binary("kubectl").parent), str(binary("helm").parent)})
        env = {**tb.env(), "CONTAINERS_CONF": podman_env()["CONTAINERS_CONF"],
               "PATH": os.pathsep.join([*tools, os.environ.get("PATH", "")]),
               "REGISTRY": f"{tb.registry}/ml", "TRAINER": TRAINER_CPU.tag,
               "WORK": str(tmp / "work"),
               "CONTAINERS_REGISTRIES_CONF": str(insecure_registry_conf(
                   tmp / "registries.conf", tb.registry)),
               "GRPO_PLAN_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
        w = Walkthrough(tb, env, tmp / "work")
        try:
            for i, block in enumerate(walkthrough_blocks()):
                t0 = time.monotonic()
                proc = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=REPO,
                                      env=env, capture_output=True, text=True,
                                      timeout=1800, check=False)
                w.seconds.append(time.monotonic() - t0)
                w.outputs.append(proc.stdout + proc.stderr)
                print(f"--- block {i} ({w.seconds[-1]:.0f} s, exit {proc.returncode}):\n"
                      f"{block}\n{w.outputs[-1][-3000:]}")
                if proc.returncode != 0:
                    status = tb.kubectl("get", "grpojobs,pods", "-n", NS, "-o", "wide",
                                        check=False).stdout
                    raise AssertionError(
                        f"{DOC.name} block {i} failed (exit {proc.returncode}):\n{block}\n"
                        f"{w.outputs[-1][-6000:]}\n{status}")
            # Where the minutes went (image pulls from the registry among them).
            print(tb.kubectl("get", "events", "-n", NS, "--sort-by=.lastTimestamp",
                             check=False).stdout[-4000:])
            yield w
        finally:
            tb.kubectl("delete", "namespace", NS, "--wait=true", "--timeout=120s",
                       check=False)
            tb.helm("uninstall", "grpo", "-n", "grpo-system", "--wait", "--timeout", "120s",
                    check=False)
            # The page's `podman tag`s name this run's registry: left behind, they would
            # keep a replaced trainer image (7.5 GB) alive in podman's storage for good.
            # (`untag IMAGE NAME`: that name alone; `untag IMAGE` would drop every name,
            # the local tag too.)
            for name in ("operator", "trainer"):
                alias = f"{env['REGISTRY']}/grpo-operator/{name}:0.1.0"
                subprocess.run(["podman", "untag", alias, alias], env=podman_env(),
                               capture_output=True, check=False)


def scalars(event_dir: Path) -> dict[str, list[float]]:
    """Every scalar of the TensorBoard event files in ``event_dir``, by tag."""
    from tensorboard.backend.event_processing import event_accumulator

    acc = event_accumulator.EventAccumulator(str(event_dir))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_the_page_has_every_step_and_all_of_them_ran(walk: Walkthrough) -> None:
    blocks = walkthrough_blocks()
    assert len(blocks) >= 9 and len(walk.outputs) == len(blocks)
    for command in ("make images", "podman push", "helm install", "kubectl cp",
                    "score-reward", "grpo plan", "kubectl apply", "kubectl wait"):
        assert any(command in b for b in blocks), command
    print("walkthrough blocks, seconds:", [round(s) for s in walk.seconds])


def test_the_operator_runs_the_image_pushed_to_the_registry(walk: Walkthrough) -> None:
    pods = json.loads(walk.tb.kubectl("get", "pods", "-n", "grpo-system", "-o",
                                      "json").stdout)["items"]
    images = {c["image"] for p in pods for c in p["spec"]["containers"]}
    assert images == {f"{walk.env['REGISTRY']}/grpo-operator/operator:0.1.0"}, images
    # The webhook recorded the chart's default trainer image, from the registry, in
    # each job (the Ray pods that ran it are gone with their RayClusters).
    trainer = f"{walk.env['REGISTRY']}/grpo-operator/trainer:0.1.0"
    assert walk.job("my-job")["spec"]["image"] == walk.job("judged")["spec"]["image"] == trainer


def test_the_reward_tried_before_the_job_read_the_column_and_the_image(
        walk: Walkthrough) -> None:
    out = walk.output_of("score-reward")
    rows = [line for line in out.splitlines() if re.search(r"row \d+: score", line)]
    assert len(rows) == 4, out
    assert all("asks_about_image 1" in r and re.search(r"image_width (40|44|48)\b", r)
               for r in rows), rows


def test_the_plan_read_the_model_from_the_local_copy_of_the_claim(walk: Walkthrough) -> None:
    out = walk.output_of("grpo plan")
    assert "head" in out and "7Gi" in out, out


def test_my_job_succeeded_first_time_with_the_reward_from_the_configmap(
        walk: Walkthrough) -> None:
    status = walk.job("my-job")["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    assert status["restarts"] == 0 and [a["outcome"] for a in status["attempts"]] == [
        "Succeeded"]
    assert status["modelConfig"]["source"] == "claim", status["modelConfig"]
    claim = walk.tb.node.claims.wait_path(NS, "ml-checkpoints")  # type: ignore[union-attr]
    found = scalars(claim / NS / "my-job" / "tensorboard")
    steps = len(found["reward/mean"])
    assert steps == 4, sorted(found)
    assert found["reward/failed"] == [0.0] * steps
    assert found["reward/asks_about_image"] == [1.0] * steps
    # A step's mean over its rows' images, each 40, 44 or 48 px wide (tiny/data.py).
    assert all(40.0 <= w <= 48.0 for w in found["reward/image_width"]), \
        found["reward/image_width"]


def test_the_ended_attempt_reads_as_the_page_shows(walk: Walkthrough) -> None:
    out = walk.output_of("range .status.attempts")
    assert re.search(r"^0 Succeeded step 4: ", out, re.M), out


def test_the_exported_model_came_back_and_loads(walk: Walkthrough) -> None:
    model = walk.work / "trained-model"
    assert (model / "config.json").exists() and list(model.glob("*.safetensors")), \
        sorted(p.name for p in model.iterdir())
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(model).model_type == "qwen2_5_vl"


def test_the_judge_scored_the_second_job_with_its_row_and_image(walk: Walkthrough) -> None:
    status = walk.job("judged")["status"]
    assert status["phase"] == "Succeeded", json.dumps(status, indent=1)
    logs = walk.tb.kubectl("logs", "-n", NS, "deploy/judge").stdout
    scored = [json.loads(line.split(": ", 1)[1]) for line in logs.splitlines()
              if line.startswith("scored row ")]
    # 2 steps x 4 prompts x rolloutN 4 responses, each posted once (none retried).
    assert len(scored) == 32, logs[-2000:]
    assert all(s["asks_about_image"] == 1.0 and 40.0 <= s["image_width"] <= 48.0
               for s in scored), scored[:4]
