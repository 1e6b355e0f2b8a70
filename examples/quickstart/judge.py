"""A judge for the walkthrough (docs/quickstart-cluster.md): an HTTP endpoint that scores
one response per POST, as `spec.reward.type: http` calls it (docs/rewards.md, "A judge").

Standard library and PIL only, so it runs on the trainer image from a ConfigMap. It reads
what a judge of your own would: the response and the answer, another column of the row
(`problem`) and the image (sent with `sendImages: true`). Each request is logged, so
`kubectl logs deploy/judge` shows what it scored.
"""

from __future__ import annotations

import base64
import io
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from PIL import Image

# One line per request, whole: the server answers on several threads at once.
_LOG = threading.Lock()


def judge(body: dict[str, Any]) -> dict[str, float]:
    answer = str(body.get("ground_truth") or "")
    said = 1.0 if answer and answer in str(body.get("response", "")) else 0.0
    widths = [Image.open(io.BytesIO(base64.b64decode(b))).size[0]
              for b in body.get("images") or []]
    problem = str((body.get("row") or {}).get("problem", ""))
    return {"score": said, "image_width": float(widths[0]) if widths else 0.0,
            "asks_about_image": 1.0 if "<image>" in problem else 0.0}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # http.server's name for the handler
        if self.path != "/score":
            self.send_error(404, "POST /score")
            return
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        result = judge(body)
        with _LOG:
            sys.stdout.write(f"scored row {body.get('index')}: "
                             f"{json.dumps(result, sort_keys=True)}\n")
            sys.stdout.flush()
        out = json.dumps(result).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request is printed above, with what was scored


if __name__ == "__main__":
    port = int(os.environ.get("PORT", "8000"))
    print(f"judge listening on :{port}", flush=True)
    ThreadingHTTPServer(("", port), Handler).serve_forever()
