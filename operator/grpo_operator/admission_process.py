"""The admission webhooks, served by a process of their own.

Served in the operator's process, an admission waited for Kopf's event loop and the GIL,
which the watch streams and 32 reconcile threads share: one review is 2-4 ms of CPU, but
creating 200 jobs took 3.5-5.5x as long as creating 200 RayJobs (docs/benchmarks.md,
"Admission in its own process"). This process is forked from the operator's before Kopf
starts (no thread runs yet, and the imported modules' pages stay shared), serves
/validate-grpojob and /default-grpojob over TLS on --webhook-port, and ends with the
operator: the operator stops when it ends (Kubernetes restarts the pod), and it ends when
the operator is gone (a SIGKILL leaves it no one to answer for).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import multiprocessing
import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import kopf
from aiohttp import web

from . import kube
from .admission_review import DEFAULT, VALIDATE, WEBHOOKS, review_answer, webhook_at
from .config import OperatorConfig, WebhookConfig
from .webhook import default_patch, validate

log = logging.getLogger("grpo_operator.admission")

# Reviews run in threads so that one slow read (the namespace, its quotas, a hub's
# config.json; each cached) does not hold the others. Not more: the review is pure Python
# (the GIL runs one at a time) and each thread in flight holds a plan's worth of
# temporaries, which the heap keeps: with 16, a burst of 16 clients left the process
# 5-7 MiB larger than with 4 (docs/benchmarks.md, "The pod's memory").
ADMISSION_WORKERS = 4
ORPHAN_CHECK_S = 1.0  # how soon the process ends after the operator's is gone
START_TIMEOUT_S = 30.0  # it imports nothing (forked): it listens within a second
# How much lower the operator's own process (Kopf and the reconcile threads) runs than the
# admission process once it is forked: a create waits on the webhooks, a reconcile can
# wait a few milliseconds. Raising a niceness needs no privilege. Under a burst of 200
# creates the API server timed the webhooks at 66-77 ms instead of 100-214 ms
# (docs/benchmarks.md, "The pod's memory").
RECONCILE_NICENESS = 5


def reachable(bind: str) -> str:
    """An address a local client reaches a server bound to ``bind`` at: loopback for a
    catch-all address (of its family, as Kopf's webhook server reported it)."""
    return {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(bind, bind)


def endpoint_url(hook: WebhookConfig, bind: str) -> str:
    """Where the API server reaches the webhooks (managed configurations): --webhook-host,
    else the bind address."""
    host = hook.host or reachable(bind)
    return f"https://{f'[{host}]' if ':' in host else host}:{hook.port}"


async def until_listening(handle: AdmissionProcess, bind: str, port: int,
                          timeout_s: float = START_TIMEOUT_S) -> None:
    """Return once the admission process accepts connections: managed configurations
    are written only then (with failurePolicy Fail, the API server refuses every GRPOJob
    write that a webhook it cannot reach would review). RuntimeError, saying why, when
    the process ended or never listened."""
    host = reachable(bind)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _, writer = await asyncio.open_connection(host, port)
            writer.close()
            await writer.wait_closed()
            return
        except OSError as exc:
            if handle.exitcode is not None:
                raise RuntimeError(f"the admission process ended (exit code "
                                   f"{handle.exitcode}) before it listened on port {port}; "
                                   "its log lines above say why") from exc
            if time.monotonic() > deadline:
                raise RuntimeError(f"the admission process does not listen on {host}:{port} "
                                   f"after {timeout_s:.0f} s ({exc})") from exc
            await asyncio.sleep(0.1)


def ca_bundle(hook: WebhookConfig) -> bytes | None:
    """What the API server should trust: --webhook-ca, else the certificate itself."""
    source = hook.ca or hook.cert
    return Path(source).read_bytes() if source else None


async def answer(review: dict[str, Any], path: str | None, config: OperatorConfig,
                 pool: ThreadPoolExecutor) -> dict[str, Any]:
    """One AdmissionReview's answer; an unexpected error refuses the write with its words
    (as Kopf answered), logged with its stack."""
    webhook = webhook_at(path)
    if webhook is None:
        raise web.HTTPNotFound(reason=f"no webhook at {path!r}: this operator serves "
                               + ", ".join(f"/{w.path}" for w in WEBHOOKS))
    request = review.get("request") or {}
    body = request.get("object") or {}
    namespace = str(request.get("namespace") or (body.get("metadata") or {}).get("namespace")
                    or "")
    try:
        if webhook is DEFAULT:
            return review_answer(review, patch=default_patch(body, namespace, config))
        assert webhook is VALIDATE
        found = await asyncio.get_running_loop().run_in_executor(
            pool, validate, body, request.get("oldObject"), request.get("operation"),
            namespace, config)
        return review_answer(review, found.problem, warnings=found.warnings)
    except Exception as exc:
        log.exception("admission: %s of %s/%s failed", webhook.path, namespace,
                      (body.get("metadata") or {}).get("name"))
        return review_answer(review, f"the GRPO operator's admission failed: {exc!r}",
                             code=500)


async def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        await asyncio.sleep(ORPHAN_CHECK_S)
    log.error("admission: the operator's process %d is gone; stopping", parent)
    os._exit(1)


async def serve(config: OperatorConfig, parent: int) -> None:
    """Serve the webhooks until the operator's process is gone (the child's main)."""
    kube.load_config(config.kubeconfig)
    hook = config.webhook
    pool = ThreadPoolExecutor(ADMISSION_WORKERS, thread_name_prefix="admission")
    orphaned = asyncio.create_task(_exit_when_orphaned(parent))

    async def fn(review: Any, *, webhook: str | None = None, **_: Any) -> dict[str, Any]:
        return await answer(review, webhook, config, pool)

    # Kopf's server for TLS and the certificate's reload; the answers are ours.
    server = kopf.WebhookServer(addr=config.bind, port=hook.port, host=hook.host,
                                certfile=hook.cert, pkeyfile=hook.key, cafile=hook.ca,
                                file_check_interval=hook.cert_check_seconds)
    # Kopf types a review as its own TypedDicts (not exported); ours are plain dicts.
    async for _ in server(cast(kopf.WebhookFn, fn)):
        log.info("admission: serving %s on %s:%d (process %d)",
                 ", ".join(f"/{w.path}" for w in WEBHOOKS), config.bind, hook.port,
                 os.getpid())
    orphaned.cancel()


def _child_main(config: OperatorConfig, parent: int) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C stops the operator, which stops us
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    asyncio.run(serve(config, parent))


class AdmissionProcess:
    """The parent's handle on the admission process."""

    def __init__(self, config: OperatorConfig) -> None:
        # fork: started before Kopf makes any thread; the child keeps the parent's
        # imported modules (shared pages) instead of importing them again.
        context = multiprocessing.get_context("fork")
        self.process = context.Process(target=_child_main, args=(config, os.getpid()),
                                       name="grpo-admission", daemon=True)

    @classmethod
    def start(cls, config: OperatorConfig) -> AdmissionProcess:
        """Fork, and serve in the child; then this process yields the CPU to it
        (``RECONCILE_NICENESS``)."""
        # What is allocated by now (the imported modules, mostly) is moved out of the
        # collector's reach in both processes: a collection writes the header of every
        # object it visits, which copies the page the two shared. 16 MiB less of the pair's
        # PSS after 200 admissions (docs/benchmarks.md, "Admission in its own process").
        gc.freeze()
        handle = cls(config)
        handle.process.start()
        try:
            os.nice(RECONCILE_NICENESS)
        except OSError as exc:  # not expected (lowering one's priority is always allowed)
            log.warning("admission: the operator's process keeps its priority (%s)", exc)
        return handle

    @property
    def exitcode(self) -> int | None:
        return self.process.exitcode

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(5)
