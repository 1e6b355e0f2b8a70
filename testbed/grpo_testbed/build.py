"""Build the testbed's Go programs from the Go module proxy, at pinned versions.

``k8s.io/kubernetes`` cannot be ``go install``ed: its go.mod replaces its staging
modules with local directories. So each component gets a throwaway module that
requires it, maps every ``=> ./staging/...`` replace to the published staging
version, and builds the main packages from there.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .versions import COMPONENTS, Component, bin_dir, cache_root

log = logging.getLogger("grpo_testbed.build")

_REPLACE_RE = re.compile(r"^\s*(\S+)(?:\s+(v\S+))?\s*=>\s*(\S+)(?:\s+(v\S+))?\s*$")


class BuildError(RuntimeError):
    pass


# The Go compiler collects garbage less often with a larger GOGC: 7% off a cold build
# (versitygw, empty build cache: 105.6 s at 100, 97.7 s at 400; docs/benchmarks.md) for
# more memory per compile, which 2 parallel compiles on a 24 GiB machine have to spare.
BUILD_GOGC = "400"


def go_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS="-mod=mod -buildvcs=false")
    env.setdefault("GOGC", BUILD_GOGC)
    return env


def _go(args: list[str], cwd: Path) -> str:
    if shutil.which("go") is None:
        raise BuildError(
            "the testbed is built with Go, and `go` is not on PATH: install Go >= 1.26 "
            "(e.g. `apt-get install golang` is too old; use the Go toolchain from go.dev)"
        )
    proc = subprocess.run(
        ["go", *args], cwd=cwd, env=go_env(), capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise BuildError(f"`go {' '.join(args)}` failed in {cwd}:\n{proc.stderr[-4000:]}")
    return proc.stdout


def directive_entries(gomod: str, keyword: str) -> list[str]:
    """The entries of every ``keyword`` directive of a go.mod, one-line or block form,
    comments stripped (e.g. ``keyword="replace"`` -> ``["a => b v1", ...]``)."""
    entries: list[str] = []
    in_block = False
    for raw in gomod.splitlines():
        line = raw.split("//", 1)[0].strip()
        if line.startswith(f"{keyword} ("):
            in_block = True
        elif in_block and line == ")":
            in_block = False
        elif in_block and line:
            entries.append(line)
        elif line.startswith(f"{keyword} "):
            entries.append(line[len(keyword) + 1 :].strip())
    return entries


def replace_lines(upstream_gomod: str, staging_version: str | None) -> list[str]:
    """Replace directives for the throwaway module, derived from upstream's go.mod.

    Local-path replaces of staging modules become the published staging version;
    other local-path replaces are dropped (their targets are published modules we
    get through normal requirements); version replaces are kept as they are.
    """
    lines: list[str] = []
    for entry in directive_entries(upstream_gomod, "replace"):
        m = _REPLACE_RE.match(entry)
        if not m:
            continue
        old, old_v, new, new_v = m.groups()
        if new.startswith("."):
            if staging_version and "/staging/" in new:
                lines.append(f"{old} => {old} {staging_version}")
            continue
        lines.append(f"{old}{' ' + old_v if old_v else ''} => {new} {new_v or ''}".strip())
    return lines


def _download(c: Component, work: Path) -> dict[str, str]:
    out = _go(["mod", "download", "-json", f"{c.module}@{c.version}"], work)
    info: dict[str, str] = json.loads(out)
    if "Error" in info:
        raise BuildError(
            f"cannot download {c.module}@{c.version} from the Go module proxy: {info['Error']}"
        )
    return info


def _copy_data(c: Component, module_dir: Path, dest: Path) -> None:
    for pattern, sub in c.data:
        matches = sorted(module_dir.glob(pattern))
        if not matches:
            raise BuildError(f"{c.module}@{c.version} has no {pattern}")
        (dest / sub).mkdir(parents=True, exist_ok=True)
        for f in matches:
            shutil.copyfile(f, dest / sub / f.name)


def is_built(c: Component) -> bool:
    out_dir = bin_dir(c)
    return all((out_dir / b).is_file() for b in c.binaries) and all(
        any((out_dir / sub).glob("*")) for _, sub in c.data
    )


def build_component(c: Component) -> Path:
    out_dir = bin_dir(c)
    if is_built(c):
        return out_dir
    work = cache_root() / "build" / c.key
    work.mkdir(parents=True, exist_ok=True)
    if not c.packages:  # data only: the module's files, nothing to build
        return _keep_data(c, _download(c, work), out_dir)
    go_version = _go(["env", "GOVERSION"], work).strip().removeprefix("go")
    go_version = ".".join(go_version.split(".")[:2]) + ".0"
    info = _download(c, work)
    upstream = Path(info["GoMod"]).read_text()
    replaces = replace_lines(upstream, c.staging_version)
    # Upstream's excludes only apply when it is the main module: without them the wrapper
    # may resolve versions upstream deliberately avoids (containerd).
    excludes = directive_entries(upstream, "exclude")
    gomod = [f"module grpo.dev/testbed/{c.name}", "", f"go {go_version}", "",
             f"require {c.module} {c.version}", ""]
    if replaces:
        gomod += ["replace (", *(f"\t{r}" for r in replaces), ")", ""]
    if excludes:
        gomod += ["exclude (", *(f"\t{e}" for e in excludes), ")", ""]
    (work / "go.mod").write_text("\n".join(gomod))
    imports = "\n".join(f'\t_ "{p}"' for p in c.packages)
    (work / "tools.go").write_text(f"//go:build tools\n\npackage tools\n\nimport (\n{imports}\n)\n")
    _go(["mod", "tidy"], work)
    staging = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    ldflags = " ".join(("-s", "-w", *c.ldflags))
    tags = ["-tags", ",".join(c.tags)] if c.tags else []
    t0 = time.monotonic()
    # One `go build` for all of a component's programs: the go command links them side by
    # side (a link is mostly one core) and hashes the shared dependencies once.
    _go(["build", "-trimpath", *tags, "-ldflags", ldflags, "-o", f"{staging}/", *c.packages],
        work)
    for pkg, name in zip(c.packages, c.binaries, strict=True):
        built = staging / _program_name(pkg)
        if built.name != name:
            built.rename(staging / name)
    log.info("  built %s in %.0f s", ", ".join(c.binaries), time.monotonic() - t0)
    return _keep_data(c, info, out_dir, staging)


def _program_name(pkg: str) -> str:
    """The file `go build -o dir/` writes a main package to: the import path's last
    element, or the one before a major-version suffix (``.../server/v3`` -> ``server``)."""
    parts = pkg.split("/")
    if len(parts) > 1 and re.fullmatch(r"v[2-9]\d*", parts[-1]):
        return parts[-2]
    return parts[-1]


def _keep_data(c: Component, info: dict[str, str], out_dir: Path,
               staging: Path | None = None) -> Path:
    """Copy the component's data files beside its binaries (built into `staging`) and put
    the whole in place at once, so a cut build leaves nothing that reads as built."""
    if staging is None:
        staging = out_dir.with_name(out_dir.name + ".partial")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    _copy_data(c, Path(info["Dir"]), staging)
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)
    return out_dir


def build_all(names: list[str] | None = None) -> dict[str, Path]:
    """Build (or reuse) every component; returns component name -> bin dir."""
    wanted = [c for c in COMPONENTS if names is None or c.name in names]
    result: dict[str, Path] = {}
    t_all = time.monotonic()
    for i, c in enumerate(wanted, 1):
        cached = is_built(c)
        log.info("[%d/%d] %s %s: %s", i, len(wanted), c.name, c.version,
                 "cached" if cached else "building (first time; minutes)")
        t0 = time.monotonic()
        result[c.name] = build_component(c)
        if not cached:
            log.info("[%d/%d] %s ready in %.0f s", i, len(wanted), c.name, time.monotonic() - t0)
    log.info("testbed binaries ready in %.1f s under %s", time.monotonic() - t_all,
             cache_root() / "bin")
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    build_all(sys.argv[1:] or None)
