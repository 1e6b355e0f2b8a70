"""`grpo-testbed images`: the product's images, built from this checkout into local storage.

No registry is reachable here, so the Dockerfiles' base images come from elsewhere, as
build arguments (the same Dockerfiles build on a CI with registry access unchanged):

- a Debian bookworm base, made by ``mmdebstrap`` from the apt mirror and imported
  with ``podman import`` (Debian's CPython 3.11 stands in for python:3.11-slim and uv's
  managed CPython);
- a uv image holding the uv binary of this checkout's .venv (PyPI's uv, at the
  version hack/setup.sh pins) in place of ghcr.io/astral-sh/uv.

``buildah bud --isolation chroot`` then builds images/operator and images/trainer (its
CPU variant) into the storage podman and runc use; the trainer's GPU variant, from the
same base, only when named (``grpo-testbed images trainer-gpu``, ``make image-gpu``).
Each image is labelled with a hash of its inputs (Dockerfile, the files its
.dockerignore lets in, build arguments, the bases' IDs) and rebuilt only when that hash
changes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

log = logging.getLogger("grpo_testbed.images")

REPO = Path(__file__).resolve().parents[2]
UV_VERSION = "0.13.8"  # hack/setup.sh installs this uv into .venv
DEBIAN_SUITE = "bookworm"
# passwd: useradd/groupadd in the Dockerfiles; procps: `ray status`, ps.
BASE_PACKAGES = ("python3", "ca-certificates", "passwd", "procps")
BASE_TAG = f"localhost/grpo-base:{DEBIAN_SUITE}"
UV_TAG = f"localhost/uv:{UV_VERSION}"
SYSTEM_PYTHON = "/usr/bin/python3.11"
INPUTS_LABEL = "dev.grpo-operator.inputs"
TOOLS = {"buildah": "buildah", "podman": "podman", "mmdebstrap": "mmdebstrap",
         "runc": "runc"}
# The uv cache of the machine (hack/setup.sh fills it with the same wheels the CPU
# trainer's lock pins), mounted into the trainer build so a cold build downloads little.
HOST_UV_CACHE = Path(os.environ.get("UV_CACHE_DIR", Path.home() / ".cache" / "uv"))
BUILD_UV_CACHE = "/root/.cache/uv-host"
# This machine's CA bundle, bind-mounted read-only over the image's during RUN steps
# (never into the image): where egress goes through a TLS proxy, PyPI's certificate is
# signed by a CA only the machine trusts. Debian's path; SSL_CERT_FILE overrides it.
BUILD_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"


CONTAINERS_CONF = Path(__file__).parent / "config" / "containers.conf"


def podman_env() -> dict[str, str]:
    """The environment for podman: this machine's settings (runc, the host's ulimits)."""
    return {**os.environ, "CONTAINERS_CONF": str(CONTAINERS_CONF)}


class ImageError(RuntimeError):
    pass


@dataclass(frozen=True)
class Image:
    """One image this repository ships, as built here."""

    name: str
    tag: str
    dockerfile: str  # relative to the repository root, which is the build context
    build_args: Mapping[str, str] = field(default_factory=dict)
    lock: str = ""  # the hash-checked lock its virtualenv is installed from
    uv_cache: bool = False  # mount the host's uv cache for the dependency layer

    @property
    def ignorefile(self) -> Path:
        return REPO / f"{self.dockerfile}.dockerignore"


OPERATOR = Image(
    "operator", "localhost/grpo-operator/operator:0.1.0", "images/operator/Dockerfile",
    {"PYTHON_IMAGE": BASE_TAG, "UV_IMAGE": UV_TAG, "PYTHON": SYSTEM_PYTHON},
    lock="images/operator/requirements.lock")
TRAINER_CPU = Image(
    "trainer-cpu", "localhost/grpo-operator/trainer:0.1.0-cpu", "images/trainer/Dockerfile",
    {"RUNTIME_IMAGE": BASE_TAG, "UV_IMAGE": UV_TAG,
     "PYTHON": SYSTEM_PYTHON, "VARIANT": "cpu", "UV_CACHE_DIR": BUILD_UV_CACHE},
    lock="images/trainer/requirements-cpu.lock", uv_cache=True)
# The GPU trainer, the chart's default trainerImage: the CPU variant's base and tools,
# the GPU lock (PyPI's CUDA wheels carry the CUDA runtime; the NVIDIA container toolkit
# brings the driver). 9.3 GB, so neither `make images` nor the images tier builds it.
TRAINER_GPU = Image(
    "trainer-gpu", "localhost/grpo-operator/trainer:0.1.0", TRAINER_CPU.dockerfile,
    {**TRAINER_CPU.build_args, "VARIANT": "gpu"}, lock="images/trainer/requirements.lock",
    uv_cache=True)
IMAGES = (OPERATOR, TRAINER_CPU)  # built by default
ON_REQUEST = (TRAINER_GPU,)  # built only when named


# ---- pure: what goes into an image ------------------------------------------------


def select(names: Iterable[str] | None = None) -> list[Image]:
    """The named images, or IMAGES when none are named."""
    known = {i.name: i for i in (*IMAGES, *ON_REQUEST)}
    wanted = list(dict.fromkeys(names or ()))
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ImageError(f"unknown image(s) {unknown}; known: {list(known)}")
    return [known[n] for n in wanted] if wanted else list(IMAGES)


def context_files(root: Path, ignore_lines: Iterable[str]) -> list[Path]:
    """The files a .dockerignore of the form ``*``, then ``!path`` and ``path`` lines,
    lets into the context: as in Docker, the last line that matches a file decides.

    Only plain paths are understood besides ``*`` (the form images/*/Dockerfile.dockerignore
    use); ``**/__pycache__`` and ``**/*.pyc`` are dropped as BuildKit would.
    """
    rules: list[tuple[bool, str]] = []  # (let in, path), in file order
    for raw in ignore_lines:
        line = raw.strip()
        if not line or line.startswith("#") or line in ("*", "**/__pycache__", "**/*.pyc"):
            continue
        keep = line.startswith("!")
        prefix = line.lstrip("!").rstrip("/")
        if any(c in prefix for c in "*?["):
            raise ImageError(f"unsupported .dockerignore line: {line!r} (plain paths only)")
        rules.append((keep, prefix))

    def let_in(rel: str) -> bool:
        verdict = False
        for keep, prefix in rules:
            if rel == prefix or rel.startswith(prefix + "/"):
                verdict = keep
        return verdict

    files: list[Path] = []
    for keep, prefix in rules:
        if not keep:
            continue
        path = root / prefix
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files += [
            p for p in found
            if "__pycache__" not in p.parts and p.suffix != ".pyc"
            and let_in(p.relative_to(root).as_posix())
        ]
    return sorted(set(files))


def inputs_hash(root: Path, dockerfile: Path, files: Iterable[Path],
                build_args: Mapping[str, str], base_ids: Iterable[str]) -> str:
    """Everything the image is a function of; a change in any of it means a rebuild."""
    h = hashlib.sha256()
    h.update(dockerfile.read_bytes())
    for path in files:
        h.update(str(path.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    h.update(json.dumps(dict(sorted(build_args.items()))).encode())
    for base in base_ids:
        h.update(base.encode())
    return h.hexdigest()[:32]


def base_hash() -> str:
    return hashlib.sha256(json.dumps([DEBIAN_SUITE, "minbase", *BASE_PACKAGES]).encode()
                          ).hexdigest()[:32]


# ---- edges: podman, buildah, mmdebstrap -------------------------------------------


def require_tools() -> None:
    missing = [t for t in TOOLS.values() if shutil.which(t) is None]
    if missing:
        raise ImageError(f"image builds need {', '.join(missing)}: run hack/setup.sh "
                         f"(or `apt-get install {' '.join(missing)}` on Debian)")


def run_tool(argv: list[str], what: str, log_file: Path | None = None) -> str:
    """Run a tool; its output goes to ``log_file`` (with a line per build step here)."""
    t0 = time.monotonic()
    if log_file is None:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise ImageError(f"{what} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout
    with open(log_file, "a") as out, subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            out.write(line)
            out.flush()
            if "STEP " in line or line.startswith("COMMIT "):
                log.info("  %s [t+%.0f s] %s", what, time.monotonic() - t0, line.strip()[:110])
    if proc.returncode != 0:
        tail = "".join(log_file.read_text(errors="replace").splitlines(True)[-30:])
        raise ImageError(f"{what} failed ({proc.returncode}); log {log_file}:\n{tail}")
    return ""


def label(tag: str, key: str = INPUTS_LABEL) -> str | None:
    """A label of a local image, or None when there is no such image."""
    proc = subprocess.run(["podman", "image", "inspect", tag], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
        return None
    labels = json.loads(proc.stdout)[0].get("Labels") or {}
    return str(labels.get(key, ""))


def image_id(tag: str) -> str:
    return run_tool(["podman", "image", "inspect", "--format", "{{.Id}}", tag],
                    f"inspect {tag}").strip()


def ensure_base(workdir: Path) -> None:
    want = base_hash()
    if label(BASE_TAG) == want:
        return
    t0 = time.monotonic()
    log.info("base %s: mmdebstrap %s minbase + %s", BASE_TAG, DEBIAN_SUITE,
             ",".join(BASE_PACKAGES))
    tar = workdir / "rootfs.tar"
    run_tool(["mmdebstrap", "--variant=minbase", "--include=" + ",".join(BASE_PACKAGES),
              "--aptopt=Acquire::Retries=3", DEBIAN_SUITE, str(tar)], "mmdebstrap",
             workdir / "mmdebstrap.log")
    run_tool(["podman", "import", "--change", f"LABEL {INPUTS_LABEL}={want}",
              "--change", 'CMD ["/bin/bash"]', str(tar), BASE_TAG], "podman import")
    log.info("base %s: built in %.0f s", BASE_TAG, time.monotonic() - t0)


def ensure_uv(workdir: Path) -> None:
    uv = REPO / ".venv" / "bin" / "uv"
    version = subprocess.run([str(uv), "--version"], capture_output=True, text=True,
                             check=False).stdout.split()
    if version[1:2] != [UV_VERSION]:
        raise ImageError(f"{uv} is not uv {UV_VERSION} ({version}): run hack/setup.sh")
    want = hashlib.sha256(uv.read_bytes()).hexdigest()[:32]
    if label(UV_TAG) == want:
        return
    ctx = workdir / "uv-context"
    ctx.mkdir(parents=True, exist_ok=True)
    shutil.copy2(uv, ctx / "uv")
    # Like ghcr.io/astral-sh/uv: the binary at /uv and nothing else.
    (ctx / "Containerfile").write_text(f"FROM scratch\nCOPY uv /uv\n"
                                       f"LABEL {INPUTS_LABEL}={want}\n")
    run_tool(["buildah", "bud", "--isolation", "chroot", "-t", UV_TAG, str(ctx)], "uv image",
             workdir / "uv.log")
    log.info("uv image %s from %s", UV_TAG, uv)


def build_image(image: Image, workdir: Path, force: bool = False) -> bool:
    """Build ``image`` unless an image with the same inputs is there. True if built."""
    ignore = image.ignorefile.read_text().splitlines()
    files = context_files(REPO, ignore)
    bases = [image_id(t) for t in sorted(set(image.build_args.values()))
             if t in (BASE_TAG, UV_TAG)]
    want = inputs_hash(REPO, REPO / image.dockerfile, [image.ignorefile, *files],
                       image.build_args, bases)
    current = label(image.tag)
    if not force and current == want:
        log.info("%s: up to date (%s, inputs %s)", image.name, image.tag, want[:12])
        return False
    replaced = image_id(image.tag) if current is not None else None
    make_room(image)
    t0 = time.monotonic()
    log.info("%s: building %s from %s (%d context files); log %s", image.name, image.tag,
             image.dockerfile, len(files), workdir / f"{image.name}.log")
    argv = ["buildah", "bud", "--isolation", "chroot", "--layers", "-f",
            str(REPO / image.dockerfile), "--ignorefile", str(image.ignorefile),
            "-t", image.tag, "--label", f"{INPUTS_LABEL}={want}"]
    for key, value in image.build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    host_ca = Path(os.environ.get("SSL_CERT_FILE", BUILD_CA_BUNDLE))
    if host_ca.is_file():
        argv += ["--volume", f"{host_ca}:{BUILD_CA_BUNDLE}:ro",
                 "--build-arg", "UV_SYSTEM_CERTS=true"]
    if image.uv_cache:
        HOST_UV_CACHE.mkdir(parents=True, exist_ok=True)
        argv += ["--volume", f"{HOST_UV_CACHE}:{BUILD_UV_CACHE}"]
    run_tool([*argv, str(REPO)], image.name, workdir / f"{image.name}.log")
    log.info("%s: built in %.0f s, %.2f GB", image.name, time.monotonic() - t0,
             image_size(image.tag) / 1e9)
    if replaced is not None and replaced != image_id(image.tag):
        drop_image(replaced)
    return True


# What a build needs free on podman's storage, in bytes: the trainer's 7.5 GB layer is
# committed through a temporary copy (a cold build peaked at 26 GB above its start,
# docs/benchmarks.md, "Disk: the virtualenv stored once").
BUILD_ROOM = {"trainer-cpu": 30 * 10**9, "trainer-gpu": 36 * 10**9}


def must_prune(free: int, image: Image) -> bool:
    """Whether to drop podman's untagged images (the layer cache) before building
    ``image``: only when the disk is short of what its build needs."""
    return free < BUILD_ROOM.get(image.name, 0)


def make_room(image: Image) -> None:
    """On a disk short of a build's room, drop the untagged images first: a machine that
    keeps podman's storage between runs keeps every stage a changed Dockerfile orphaned,
    and a full disk fails the build halfway (CI's run of stop 59). The cost is the layer
    cache of unchanged stages, said in the log."""
    storage = Path(run_tool(["podman", "info", "--format", "{{.Store.GraphRoot}}"],
                            "podman info").strip())
    free = shutil.disk_usage(storage).free
    if not must_prune(free, image):
        return
    log.warning("%s: %.0f GB free on %s, less than the %.0f GB its build needs: removing "
                "untagged images (the layer cache; the next build of an unchanged image "
                "is slower)", image.name, free / 1e9, storage,
                BUILD_ROOM[image.name] / 1e9)
    run_tool(["podman", "image", "prune", "--force"], "podman image prune")
    log.info("%s: %.0f GB free after pruning", image.name,
             shutil.disk_usage(storage).free / 1e9)


def drop_image(ident: str) -> None:
    """Remove the image a build replaced (7 GB for the trainer: rebuilds filled a disk).
    Only that one: untagged stage images of any image are the layer cache of its next
    build. Kept when a container still uses it."""
    subprocess.run(["podman", "rmi", ident], env=podman_env(), capture_output=True,
                   check=False, timeout=600)


def image_size(tag: str) -> int:
    out = run_tool(["podman", "image", "inspect", "--format", "{{.Size}}", tag], "inspect")
    return int(out.strip())


def build_all(names: Iterable[str] | None = None, force: bool = False,
              workdir: Path | None = None) -> list[Image]:
    """Build (or reuse) the named images (default: IMAGES); returns those built."""
    wanted = select(names)
    require_tools()
    logs = workdir or Path(tempfile.mkdtemp(prefix="grpo-images-"))
    logs.mkdir(parents=True, exist_ok=True)
    ensure_base(logs)
    ensure_uv(logs)
    return [i for i in wanted if build_image(i, logs, force)]
