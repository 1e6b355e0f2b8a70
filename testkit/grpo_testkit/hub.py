"""A STAND-IN for the Hugging Face Hub, for tests only: it serves the hub's file API
(repo info with file sizes, `resolve` downloads with HEAD metadata and byte ranges) for
repos kept as plain directories, on loopback. Tests cannot reach the real hub; everything
after the download (the files on the volume, loading them) is real.

Layout: `<root>/models/<owner>/<name>/...` and `<root>/datasets/<owner>/<name>/...`; one
revision, "main", whose commit id is a hash of the file names and sizes. `fail_after`
makes a download stop after that many bytes of a file (a dropped connection), once per
file, to exercise resuming. `token` makes it a private hub: a request without
`Authorization: Bearer <token>` gets 401, as the hub answers for a private repo.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

_INFO = re.compile(r"^/api/(models|datasets)/([^/]+/[^/]+?)(?:/revision/([^/]+))?$")
_RESOLVE = re.compile(r"^/(datasets/)?(.+?)/resolve/([^/]+)/(.+)$")


@dataclass
class StandInHub:
    root: Path
    fail_after: int | None = None  # bytes served of a file before its first download drops
    delay_s: float = 0.0  # pause per 64 KiB sent: slow enough to kill a fetch mid-file
    token: str | None = None  # set: every request must carry it (a private repo)
    requests: list[str] = field(default_factory=list)
    _dropped: set[str] = field(default_factory=set)
    url: str = ""

    def repo_dir(self, kind: str, repo: str) -> Path:
        return self.root / kind / repo

    def files(self, kind: str, repo: str) -> list[Path]:
        base = self.repo_dir(kind, repo)
        return sorted(p for p in base.rglob("*") if p.is_file())

    def commit(self, kind: str, repo: str) -> str:
        base = self.repo_dir(kind, repo)
        ids = "".join(f"{p.relative_to(base)}:{p.stat().st_size};" for p in self.files(kind, repo))
        return hashlib.sha1(ids.encode()).hexdigest()


def _handler(hub: StandInHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: Any) -> None:  # quiet
            pass

        def _send(self, code: int, body: bytes = b"", headers: dict[str, str] | None = None,
                  head: bool = False) -> None:
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", (headers or {}).get("Content-Length",
                                                                   str(len(body))))
            self.end_headers()
            if not head:
                self.wfile.write(body)

        def _info(self, kind: str, repo: str) -> None:
            base = hub.repo_dir(kind, repo)
            if not base.is_dir():
                self._send(404, b'{"error": "Repository not found"}',
                           {"X-Error-Code": "RepoNotFound"})
                return
            siblings = [{"rfilename": str(p.relative_to(base)), "size": p.stat().st_size}
                        for p in hub.files(kind, repo)]
            body = json.dumps({"id": repo, "sha": hub.commit(kind, repo),
                               "siblings": siblings, "private": False}).encode()
            self._send(200, body, {"Content-Type": "application/json"})

        def _resolve(self, kind: str, repo: str, name: str, head: bool) -> None:
            path = hub.repo_dir(kind, repo) / name
            if not path.is_file():
                self._send(404, b"", {"X-Error-Code": "EntryNotFound"}, head)
                return
            data = path.read_bytes()
            etag = hashlib.sha256(data).hexdigest()
            headers = {"X-Repo-Commit": hub.commit(kind, repo), "ETag": f'"{etag}"',
                       "Accept-Ranges": "bytes"}
            start = 0
            match = re.match(r"bytes=(\d+)-", self.headers.get("Range") or "")
            if match:
                start = int(match.group(1))
            part = data[start:]
            headers["Content-Length"] = str(len(part))
            code = 206 if start else 200
            if start:
                headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            key = f"{kind}/{repo}/{name}"
            if head or hub.fail_after is None or key in hub._dropped:
                if head or not hub.delay_s:
                    self._send(code, part, headers, head)
                    return
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                for i in range(0, len(part), 65536):
                    self.wfile.write(part[i:i + 65536])
                    self.wfile.flush()
                    time.sleep(hub.delay_s)
                return
            hub._dropped.add(key)  # this once: send part of it, then drop the connection
            self.send_response(code)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(part[: hub.fail_after])
            self.wfile.flush()
            self.close_connection = True

        def _route(self, head: bool) -> None:
            ranged = self.headers.get("Range")
            hub.requests.append(f"{self.command} {self.path}" + (f" {ranged}" if ranged else ""))
            path = self.path.split("?", 1)[0]
            if hub.token and self.headers.get("Authorization") != f"Bearer {hub.token}":
                self._send(401, b'{"error": "Invalid credentials in Authorization header"}',
                           {"X-Error-Code": "RepoNotFound"}, head)
            elif m := _INFO.match(path):
                self._info(m.group(1), m.group(2))
            elif m := _RESOLVE.match(path):
                self._resolve("datasets" if m.group(1) else "models", m.group(2),
                              m.group(4), head)
            else:
                self._send(404, b"", {}, head)

        def do_GET(self) -> None:
            self._route(head=False)

        def do_HEAD(self) -> None:
            self._route(head=True)

    return Handler


@contextmanager
def stand_in_hub(root: Path, fail_after: int | None = None, delay_s: float = 0.0,
                 token: str | None = None) -> Iterator[StandInHub]:
    """The stand-in hub on 127.0.0.1 (any free port) while the block runs."""
    hub = StandInHub(root, fail_after, delay_s, token)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
