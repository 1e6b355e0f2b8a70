"""Shared-memory segments that a killed vLLM run left behind, and their removal.

vLLM's CPU tensor-parallel communicator gives each rank of a TP (or PP) group one
POSIX shared-memory segment, created exclusively (``O_EXCL``) under a name that is
the same for every run with the same layout: vLLM 0.32 builds it from the executor's
init method, which is always ``env://`` under the external launcher, so rank 0 of
the first TP pair creates ``/dev/shm/-tp:0-[0-1]-cpushm_0``. A run that exits
normally unlinks its segments; one that is SIGKILLed or OOM-killed cannot, and the
next run on the same machine (the resumed run, or a container restarted in a pod
whose ``/dev/shm`` volume outlives it) then dies in vLLM's ``Worker.setup`` with
"create shm in SHMManager failed. errno: 17" (EEXIST). vLLM has no option to name
them per run (it overwrites ``VLLM_DIST_IDENT`` itself), so each rank removes the
stale ones before it creates its engine.

Stale means: the name has vLLM's pattern and no living process has the segment
mapped (``/proc/*/maps``) or open (``/proc/*/fd``). Every rank of a running engine
keeps its group's segments mapped, so a living run's segments are never touched.
Only segments this user owns are considered: another user's processes may be
invisible in ``/proc``, and their segments could not be unlinked anyway.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from contextlib import suppress
from pathlib import Path

log = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
PROC = Path("/proc")

# <ident>-<group name>-[<ranks>]-cpushm_<rank>, e.g. "-tp:0-[0-1]-cpushm_0" (ident
# "//" from "env://" loses its slashes in shm_open). vLLM's csrc/cpu/shm.cpp appends
# "_<rank>" to the group name that cpu_communicator.py builds.
VLLM_CPU_SHM = re.compile(r"-\[\d+(?:-\d+)*\]-cpushm_\d+$")

_DELETED = " (deleted)"


def shm_name(path: str, shm_dir: Path = SHM_DIR) -> str | None:
    """The segment name of a mapped or opened path (``/dev/shm/NAME``), else None."""
    prefix = f"{shm_dir}/"
    if not path.startswith(prefix):
        return None
    name = path[len(prefix) :].removesuffix(_DELETED)
    return name if name and "/" not in name else None


def shm_names_in_maps(maps: str, shm_dir: Path = SHM_DIR) -> set[str]:
    """Segment names in one process's ``/proc/PID/maps`` text."""
    names: set[str] = set()
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)  # address perms offset dev inode [pathname]
        if len(fields) == 6 and (name := shm_name(fields[5], shm_dir)) is not None:
            names.add(name)
    return names


def stale_segments(segments: Iterable[str], in_use: Iterable[str]) -> list[str]:
    """vLLM CPU-communicator segments among ``segments`` that nothing maps or holds open."""
    used = set(in_use)
    return sorted(s for s in set(segments) if VLLM_CPU_SHM.search(s) and s not in used)


# -- the thin I/O edge -----------------------------------------------------------------
def segments_in_use(proc: Path = PROC, shm_dir: Path = SHM_DIR) -> set[str]:
    """Every segment some visible process has mapped or open."""
    used: set[str] = set()
    for pid_dir in proc.iterdir():
        if not pid_dir.name.isdigit():
            continue
        try:  # a process may exit or be unreadable mid-scan: it then holds nothing we see
            used |= shm_names_in_maps((pid_dir / "maps").read_text(), shm_dir)
            for fd in (pid_dir / "fd").iterdir():
                with suppress(OSError):  # the fd may close between listing and readlink
                    if (name := shm_name(os.readlink(fd), shm_dir)) is not None:
                        used.add(name)
        except OSError:
            continue
    return used


def remove_stale_vllm_segments(shm_dir: Path = SHM_DIR, proc: Path = PROC) -> list[str]:
    """Unlink the stale vLLM CPU-communicator segments; returns the names removed."""
    try:
        ours = [p.name for p in shm_dir.iterdir() if VLLM_CPU_SHM.search(p.name) and _owned(p)]
    except OSError:  # no /dev/shm here: nothing to clean
        return []
    if not ours:
        return []
    removed: list[str] = []
    for name in stale_segments(ours, segments_in_use(proc, shm_dir)):
        try:
            (shm_dir / name).unlink()
        except FileNotFoundError:  # another rank of this run removed it first
            continue
        except OSError as err:
            log.warning("could not remove stale shared memory %s: %s", shm_dir / name, err)
            continue
        removed.append(name)
    if removed:
        log.warning(
            "removed %d shared-memory segment(s) of a vLLM run that is gone (killed?): %s",
            len(removed),
            ", ".join(removed),
        )
    return removed


def _owned(path: Path) -> bool:
    try:
        return os.geteuid() == 0 or path.stat().st_uid == os.geteuid()
    except OSError:
        return False
