"""Volumes for the real node's pods: kwok's volume stages provision every claim as a
hostPath PersistentVolume under ``/tmp/kwok-local-path-provisioner/``, and the kubelet
mounts it for real. The kubelet would create the directory as root with mode 0755, which
the product's pods (uid 10001, restricted) cannot write, so the testbed creates each one
first, writable by all, as a storage driver would hand out a fresh volume; it removes the
ones it created when it stops."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

from ..processes import wait_until

log = logging.getLogger("grpo_testbed.node")

PROVISIONER_ROOT = Path("/tmp/kwok-local-path-provisioner")


class ClaimDirectories:
    def __init__(self, kubectl: Callable[..., CompletedProcess[str]]) -> None:
        self.kubectl = kubectl
        self.made: set[Path] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="claim-dirs")

    def start(self) -> ClaimDirectories:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for path in self.made:
            shutil.rmtree(path, ignore_errors=True)

    def path_of(self, namespace: str, claim: str) -> Path | None:
        """The host directory behind a bound claim (None while unbound)."""
        pvc = self.kubectl("get", "pvc", claim, "-n", namespace, "-o", "json", check=False)
        if pvc.returncode != 0:
            return None
        volume = json.loads(pvc.stdout).get("spec", {}).get("volumeName")
        if not volume:
            return None
        pv = json.loads(self.kubectl("get", "pv", volume, "-o", "json").stdout)
        path = Path(pv["spec"]["hostPath"]["path"])
        self._prepare(path)
        return path

    def wait_path(self, namespace: str, claim: str, timeout_s: float = 60) -> Path:
        """:meth:`path_of`, once the claim is bound."""
        found: list[Path] = []

        def bound() -> bool:
            path = self.path_of(namespace, claim)
            if path is not None:
                found.append(path)
            return path is not None

        wait_until(f"claim {claim} bound", bound, timeout_s)
        return found[-1]

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                out = self.kubectl("get", "pv", "-o", "json", check=False)
            except (OSError, subprocess.SubprocessError) as err:
                # Seen once under load: exec of kubectl failed with EFAULT. A dead loop
                # would leave every later claim without its directory: try again.
                log.warning("claim directories: kubectl failed (%s); retrying", err)
                continue
            if out.returncode != 0:
                continue
            for pv in json.loads(out.stdout).get("items", []):
                host = (pv["spec"].get("hostPath") or {}).get("path")
                if host and Path(host).is_relative_to(PROVISIONER_ROOT):
                    self._prepare(Path(host))

    def _prepare(self, path: Path) -> None:
        if path in self.made:
            return
        created = not path.exists()
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)
        if created:
            self.made.add(path)
            log.info("claim directory %s", path)
