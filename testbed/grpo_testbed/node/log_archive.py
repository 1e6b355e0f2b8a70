"""Container logs kept after their pods are gone: the kubelet deletes a pod's logs with
the pod, and the operator deletes an attempt's RayCluster once it has ended. Like a
cluster's log shipper, the testbed copies every log file under the kubelet's
``podLogsDir`` as it grows, into ``<archive>/<namespace>_<pod>_<uid>/<container>.log``."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path


class LogArchive:
    def __init__(self, pod_logs: Path, archive: Path) -> None:
        self.pod_logs = pod_logs
        self.archive = archive
        self._sizes: dict[Path, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="log-archive")

    def start(self) -> LogArchive:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sync()

    def sync(self) -> None:
        for src in self.pod_logs.glob("*/*/*.log"):
            try:
                size = src.stat().st_size
            except OSError:
                continue  # removed with its pod meanwhile
            if self._sizes.get(src) == size:
                continue
            pod_dir, container = src.parts[-3], src.parts[-2]
            dest = self.archive / pod_dir / f"{container}.{src.stem}.log"
            dest.parent.mkdir(parents=True, exist_ok=True)
            try:
                shutil.copyfile(src, dest)
            except OSError:
                continue
            self._sizes[src] = size

    def pods(self, namespace: str, name_contains: str = "") -> list[Path]:
        """Archived pod directories of a namespace, oldest first."""
        self.sync()
        found = [d for d in self.archive.glob(f"{namespace}_*") if name_contains in d.name]
        return sorted(found, key=lambda d: d.stat().st_mtime)

    def text(self, pod_dir: Path) -> str:
        """Everything a pod's containers wrote, CRI log prefixes (time, stream, tag) cut."""
        lines = []
        for f in sorted(pod_dir.glob("*.log")):
            for raw in f.read_text(errors="replace").splitlines():
                parts = raw.split(" ", 3)
                lines.append(parts[3] if len(parts) == 4 else raw)
        return "\n".join(lines) + "\n"

    def _loop(self) -> None:
        while not self._stop.wait(1.0):
            self.sync()
