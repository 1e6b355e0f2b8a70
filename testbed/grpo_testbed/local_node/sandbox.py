"""A container as a local process: volumes on disk, a private mount namespace, a cgroup.

The "image" is this Python environment: its bin directory leads PATH, also for login
shells (KubeRay's head command is ``bash -lc``), through an /etc/profile of its own
that is bind-mounted inside the namespace. Mount points such as /checkpoints or
/etc/grpo are created once on the host as empty directories; what is mounted on them
is only visible inside the container's namespace.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from .podspec import ContainerPlan, Mount

IMAGE_BIN = str(Path(sys.executable).parent)
# What the "image" is made of: the environment and the checkout its editable installs
# point into. Either may live under /tmp, which each container gets privately.
IMAGE_ROOTS = (Path(sys.prefix).resolve(), Path(__file__).resolve().parents[3])
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def require_tools() -> None:
    missing = [t for t in ("unshare", "mount") if shutil.which(t) is None]
    if missing:
        raise RuntimeError(f"the local node agent needs {', '.join(missing)} (util-linux)")


def image_profile() -> str:
    return f'PATH="{IMAGE_BIN}:{SYSTEM_PATH}"\nexport PATH\n'


def base_env(pod_name: str, api_host: str, api_port: int) -> dict[str, str]:
    """What a container starts with before its pod's env: a clean image environment."""
    return {
        "PATH": f"{IMAGE_BIN}:{SYSTEM_PATH}",
        "HOSTNAME": pod_name,
        "LANG": "C.UTF-8",
        "KUBERNETES_SERVICE_HOST": api_host,
        "KUBERNETES_SERVICE_PORT": str(api_port),
        "KUBERNETES_SERVICE_PORT_HTTPS": str(api_port),
    }


def _mount_lines(m: Mount) -> list[str]:
    t = shlex.quote(m.target)
    if m.source is None:
        size = f",size={m.tmpfs_bytes}" if m.tmpfs_bytes else ""
        return [f"mkdir -p {t}", f"mount -t tmpfs -o mode=1777{size} tmpfs {t}"]
    src = shlex.quote(m.source)
    make = f"mkdir -p {t}" if Path(m.source).is_dir() else \
        f"mkdir -p {shlex.quote(str(Path(m.target).parent))} && touch {t}"
    lines = [make, f"mount --bind {src} {t}"]
    if m.read_only:
        lines.append(f"mount -o remount,bind,ro {t}")
    return lines


def start_script(plan: ContainerPlan, cgroup_procs: Path, termination_file: Path,
                 profile: Path, tmp: Path) -> str:
    """The shell that joins the cgroup, mounts the volumes and execs the container command.

    Runs as ``unshare --mount --propagation private sh SCRIPT ARGV...``; /tmp goes last
    because the other sources may live under the host's /tmp.
    """
    mounts = [*plan.mounts,
              Mount(plan.termination_path, str(termination_file)),
              Mount("/etc/profile", str(profile), read_only=True)]
    lines = ["set -e", f"echo $$ > {shlex.quote(str(cgroup_procs))}"]
    for m in mounts:
        lines += _mount_lines(m)
    # The private /tmp must not hide the image: an image root under the host's /tmp is
    # bound into it first, and /tmp is bound recursively so that it comes along.
    for root in IMAGE_ROOTS:
        if root.is_relative_to("/tmp"):
            inner = shlex.quote(str(tmp / root.relative_to("/tmp")))
            lines += [f"mkdir -p {inner}", f"mount --bind {shlex.quote(str(root))} {inner}"]
    lines += ["mkdir -p /tmp", f"mount --rbind {shlex.quote(str(tmp))} /tmp",
              "cd /", 'exec "$@"']
    return "\n".join(lines) + "\n"


def launch(plan: ContainerPlan, container_dir: Path, cgroup_procs: Path,
           log_path: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """Start the container; returns the process and the host file of its termination log."""
    container_dir.mkdir(parents=True, exist_ok=True)
    term = container_dir / "termination-log"
    term.write_text("")
    profile = container_dir / "profile"
    profile.write_text(image_profile())
    home = container_dir / "home"
    tmp = container_dir / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    tmp.chmod(0o1777)
    # What the container was given, for people and tests (the kubelet has no such file).
    (container_dir / "env.json").write_text(json.dumps(plan.env, indent=1, sort_keys=True))
    script = container_dir / "start.sh"
    script.write_text(start_script(plan, cgroup_procs, term, profile, tmp))
    # An empty home of its own: the host's dotfiles (pyenv, cargo) would rewrite PATH
    # in login shells. Not mounted over /root, where this "image's" interpreter lives.
    env = {"HOME": str(home), **plan.env}
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", str(script),
             *plan.argv],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=env, start_new_session=True, cwd="/",
        )
    return proc, term


def write_files(directory: Path, files: Mapping[str, str | bytes]) -> None:
    """A ConfigMap- or projected-volume directory: one file per key (atomic per file)."""
    directory.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        if isinstance(content, bytes):
            tmp.write_bytes(content)
        else:
            tmp.write_text(content)
        tmp.replace(path)
