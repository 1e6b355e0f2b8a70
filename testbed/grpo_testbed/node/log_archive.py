"""Container logs kept after their pods are gone: the kubelet deletes a pod's logs with
the pod, and the operator deletes an attempt's RayCluster once it has ended. Like a
cluster's log shipper, the testbed keeps every log file under the kubelet's
``podLogsDir`` in ``<archive>/<namespace>_<pod>_<uid>/<container>.<n>.log``: a hard link
(the same file, so the last lines a container writes before its pod is deleted are kept
however soon the kubelet removes its name), or a copy as it grows where no link can be
made (another filesystem)."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path


class LogArchive:
    def __init__(self, pod_logs: Path, archive: Path) -> None:
        self.pod_logs = pod_logs
        self.archive = archive
        self._seen: dict[Path, tuple[int, int]] = {}
        self._linked: set[Path] = set()
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
                st = src.stat()
            except OSError:
                continue  # removed with its pod meanwhile
            seen = (st.st_ino, st.st_size)  # a rotated log is a new file under the same name
            if self._seen.get(src) == seen:
                continue
            pod_dir, container = src.parts[-3], src.parts[-2]
            dest = self.archive / pod_dir / f"{container}.{src.stem}.log"
            try:
                self._keep(src, dest)
            except OSError:
                continue  # removed with its pod meanwhile
            self._seen[src] = seen

    def _keep(self, src: Path, dest: Path) -> None:
        if dest in self._linked:
            if os.path.samefile(src, dest):
                return  # the same file: it grows by itself
            # The kubelet rotated the log: the old file keeps a name that sorts first.
            n = len(list(dest.parent.glob(f"{dest.stem}.*.log")))
            dest.rename(dest.with_name(f"{dest.stem}.{n:03d}.log"))
            self._linked.discard(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, dest)
            self._linked.add(dest)
        except OSError:  # another filesystem (then dest is the copy made last time)
            shutil.copyfile(src, dest)

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
