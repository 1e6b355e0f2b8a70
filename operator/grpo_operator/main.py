"""`grpo-operator`: run the operator (Kopf) with /healthz, /metrics and the webhook."""

from __future__ import annotations

import logging
import os
from types import MappingProxyType
from typing import Any

import click
import kopf
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from grpo_api.contract import API_GROUP, DEFAULT_TRAINER_IMAGE

from . import handlers, kube  # noqa: F401 - importing handlers registers them with Kopf
from .catalog_file import CatalogError, load_catalog
from .config import MEMO_KEY, OperatorConfig, WebhookConfig, from_memo


async def _serve_probes(bind: str, port: int) -> web.AppRunner:
    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/metrics", metrics)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, bind, port).start()
    return runner


@kopf.on.login()
def operator_login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """Kopf uses the same credentials as our client: --kubeconfig, else in-cluster."""
    from kubernetes import client

    kube.load_config(from_memo(memo).kubeconfig)
    cfg = client.Configuration.get_default_copy()
    # The client keeps a kubeconfig's or the pod's token under "BearerToken" (older
    # versions: "authorization"); without it Kopf would talk as system:anonymous.
    raw = cfg.get_api_key_with_prefix("BearerToken") or cfg.get_api_key_with_prefix(
        "authorization") or ""
    # In-cluster, the client stores "bearer <token>" (lower case); a kubeconfig's has
    # "Bearer ". Either way Kopf wants the bare token.
    scheme, _sep, rest = raw.partition(" ")
    token = (rest if scheme.lower() == "bearer" else raw).strip()
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        scheme="Bearer" if token else None,
        token=token or None,
    )


@kopf.on.startup()
async def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = from_memo(memo)
    kube.load_config(config.kubeconfig)
    kube.warm_up()
    # Our own names on objects, and nothing written into status but our fields.
    settings.persistence.finalizer = f"{API_GROUP}/operator"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=API_GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=API_GROUP, key="last-handled-spec")
    # Only warnings become Events on the job. At INFO, Kopf posts every "Handler/Timer
    # succeeded" line: the restart timer alone (every 0.25 s during a backoff) flooded
    # the API server. The operator's own Events (Running, Restarting, ...) are explicit.
    settings.posting.level = logging.WARNING
    settings.execution.max_workers = 32
    settings.watching.server_timeout = 300  # re-list regularly; survives API restarts
    settings.networking.error_backoffs = [1, 2, 5, 10]
    # Kopf waits 5 minutes on one API request by default, and its start-up discovery
    # is such requests: one lost answer left an operator silent for minutes. The API
    # server ends its own non-watch requests at 60 s, so 30 s only cuts a dead one
    # short; a timed-out request is retried after the backoffs above.
    settings.networking.request_timeout = 30
    settings.networking.connect_timeout = 10  # watch streams too (Kopf falls back to it)
    hook = config.webhook
    if hook.port:
        settings.admission.server = kopf.WebhookServer(
            addr=config.bind, port=hook.port, host=hook.host, certfile=hook.cert,
            pkeyfile=hook.key, cafile=hook.ca)
        if hook.manage:
            settings.admission.managed = hook.manage
    if config.metrics_port:
        memo.probes = await _serve_probes(config.bind, config.metrics_port)


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    runner = memo.get("probes")
    if runner is not None:
        await runner.cleanup()


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-n", "--namespace", "namespaces", multiple=True,
              help="Watch this namespace (repeatable). Default: all namespaces.")
@click.option("--kubeconfig", type=click.Path(exists=True, dir_okay=False), default=None,
              help="Kubeconfig file; in a pod the service account is used.")
@click.option("--bind", default="0.0.0.0", show_default=True,
              help="Address for /healthz, /metrics and the webhook.")
@click.option("--metrics-port", type=int, default=8080, show_default=True,
              help="Port for /healthz and /metrics; 0 turns them off.")
@click.option("--webhook-port", type=int, default=0, show_default=True,
              help="Port of the admission webhook; 0 turns it off.")
@click.option("--webhook-host", default=None, help="Host name the API server uses to reach "
              "the webhook (self-signed certificate when no --webhook-cert).")
@click.option("--webhook-cert", type=click.Path(exists=True), default=None)
@click.option("--webhook-key", type=click.Path(exists=True), default=None)
@click.option("--webhook-ca", type=click.Path(exists=True), default=None,
              help="CA of --webhook-cert, for the caBundle of managed webhook configurations.")
@click.option("--webhook-manage", default=None, help="Let the operator create and keep the "
              "webhook configurations of this name (dev and the testbed; the chart makes its own).")
@click.option("--trainer-image", default=DEFAULT_TRAINER_IMAGE, show_default=True,
              help="Trainer image for jobs that do not set spec.image.")
@click.option("--gpu-catalog", envvar="GRPO_GPU_CATALOG", type=click.Path(dir_okay=False),
              default=None, help="YAML mapping of GPU types merged over the built-in catalog "
              "(the chart's gpuCatalog value) [env GRPO_GPU_CATALOG].")
@click.option("--pod-create-deadline", type=click.FloatRange(min=0), default=300.0,
              show_default=True, help="Seconds a Ray pod the API server keeps refusing "
              "(admission, quota) may take before the attempt fails with the refusal.")
@click.option("--peering", default=None, help="Kopf peering name: one active replica.")
@click.option("--priority", type=int, default=0, show_default=True,
              help="Peering priority: a replica pauses while one of higher priority runs.")
@click.option("--verbose", is_flag=True)
def cli(namespaces: tuple[str, ...], kubeconfig: str | None, bind: str, metrics_port: int,
        webhook_port: int, webhook_host: str | None, webhook_cert: str | None,
        webhook_key: str | None, webhook_ca: str | None, webhook_manage: str | None,
        trainer_image: str, gpu_catalog: str | None, pod_create_deadline: float,
        peering: str | None, priority: int, verbose: bool) -> None:
    """Reconcile GRPOJobs into KubeRay RayClusters, watch them, and report status."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # also for Kopf's own login
    try:
        catalog = load_catalog(gpu_catalog)
    except CatalogError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu-catalog") from None
    config = OperatorConfig(
        default_image=trainer_image, catalog=MappingProxyType(catalog), kubeconfig=kubeconfig,
        bind=bind, metrics_port=metrics_port, pod_create_deadline_seconds=pod_create_deadline,
        webhook=WebhookConfig(port=webhook_port, host=webhook_host, cert=webhook_cert,
                              key=webhook_key, ca=webhook_ca, manage=webhook_manage))
    if webhook_port:
        # Imported (and so registered with Kopf) only when there is a server for it:
        # Kopf refuses to run admission handlers without one.
        from . import webhook  # noqa: F401
    kopf.run(
        memo=kopf.Memo({MEMO_KEY: config}),
        clusterwide=not namespaces,
        namespaces=list(namespaces),
        standalone=peering is None,
        peering_name=peering,
        priority=priority,
    )


def main() -> None:
    cli()
