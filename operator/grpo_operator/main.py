"""`grpo-operator`: run the operator (Kopf) with /healthz, /metrics and the webhook."""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

import click
import kopf
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from grpo_api.contract import DEFAULT_TRAINER_IMAGE, IMAGE_UID

from . import discovery, handlers, heap_report, hub_config, kube  # noqa: F401 - handlers registers them
from .admission_process import AdmissionProcess, ca_bundle, endpoint_url, until_listening
from .admission_review import cleared_configurations, managed_configurations
from .catalog_file import CatalogError, load_catalog
from .cert_watch import CHECK_INTERVAL_S, watch_certificate
from .config import (
    DISCOVERY_TIMEOUT_S,
    HANG_GRACE_S,
    MEMO_KEY,
    WATCH_STALE_AFTER_S,
    OperatorConfig,
    WebhookConfig,
    from_memo,
)
from .hub_endpoints import parse_hub_endpoints
from .job_defaults import NO_JOB_DEFAULTS, parse_job_defaults
from .kopf_fixes import Insights, see_listed_namespaces, track_watches
from .kopf_settings import apply_settings
from .peering import MIN_PEERING_LIFETIME_S, PEERING_LIFETIME_S, SALT_RANGE, replica_priority
from .render.network_policy import parse_job_network_policy
from .ssl_buffers import shrink_tls_read_buffers
from .watch_health import WatchTracker

log = logging.getLogger("grpo_operator")
TRACKER_KEY, INSIGHTS_KEY, ADMISSION_KEY = "watch_tracker", "kopf_insights", "admission"
ADMISSION_CHECK_S = 1.0  # how soon the operator notices its admission process ended


def _watch_verdict(memo: kopf.Memo, config: OperatorConfig) -> tuple[bool, str]:
    """/healthz: the watches' verdict (watch_health.py)."""
    insights = memo[INSIGHTS_KEY]
    namespaces = None if None in insights.namespaces else len(insights.namespaces)
    verdict = memo[TRACKER_KEY].verdict([w.name for w in discovery.REQUIRED], namespaces,
                                        config.watch_stale_after_seconds)
    return verdict.healthy, verdict.detail


async def _serve_probes(bind: str, port: int, memo: kopf.Memo,
                        config: OperatorConfig) -> web.AppRunner:
    async def healthz(_: web.Request) -> web.Response:
        healthy, detail = _watch_verdict(memo, config)
        if not healthy:
            log.error("/healthz: %s", detail)
        return web.Response(text=detail, status=200 if healthy else 503)

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=generate_latest(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application()
    app.add_routes([web.get("/healthz", healthz), web.get("/metrics", metrics)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, bind, port).start()
    return runner


class PodUid(click.ParamType):
    """--trainer-pod-uid: a UID of 1 or more, or `unset` (None: the platform assigns it)."""

    name = "UID|unset"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int | None:
        if value is None:
            return None
        text = str(value).strip()
        if text.lower() == "unset":
            return None
        try:
            uid = int(text)
        except ValueError:
            self.fail(f"{text!r} is neither a UID nor 'unset': give a number of 1 or more "
                      "(the images' user is 10001), or 'unset' where the platform assigns "
                      "the UID (OpenShift restricted-v2)", param, ctx)
        if uid < 1:
            self.fail(f"{uid} is not a non-root UID: give a number of 1 or more, or 'unset'",
                      param, ctx)
        return uid


@kopf.on.login()
def operator_login(memo: kopf.Memo, **_: Any) -> kopf.ConnectionInfo:
    """Kopf uses the same credentials as our client: --kubeconfig, else in-cluster. A
    token file (the service account's, which rotates) is read now; Kopf logs in again
    when the API server refuses the token it has."""
    creds = kube.load_config(from_memo(memo).kubeconfig)
    token = creds.current_token()
    return kopf.ConnectionInfo(
        server=creds.server,
        ca_path=creds.ca_path,
        insecure=creds.insecure,
        certificate_path=creds.cert_path,
        private_key_path=creds.key_path,
        scheme="Bearer" if token else None,
        token=token or None,
    )


@kopf.on.startup()
async def operator_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = from_memo(memo)
    kube.load_config(config.kubeconfig)
    if config.metrics_port:  # first: a start that waits below is not a dead operator
        memo.probes = await _serve_probes(config.bind, config.metrics_port, memo, config)
    # Kopf scans API discovery once, after this handler: wait until it lists every kind
    # we watch, or GRPOJobs may never be watched at all (discovery.py).
    try:
        await discovery.wait_until_served(kube.read_discovery,
                                          timeout_s=config.discovery_timeout_seconds)
    except discovery.DiscoveryTimeout as exc:
        raise kopf.PermanentError(str(exc)) from exc
    kube.warm_up()
    apply_settings(settings, config.peering_lifetime_seconds)
    hook = config.webhook
    admission: AdmissionProcess | None = memo.get(ADMISSION_KEY)
    if admission is not None:
        memo.admission_watch = asyncio.create_task(_stop_when_admission_ends(admission))
        if hook.manage:  # dev and the testbed: the configurations point at our process
            try:
                await until_listening(admission, config.bind, hook.port)
            except RuntimeError as exc:
                raise kopf.PermanentError(str(exc)) from exc
            for obj in managed_configurations(hook.manage, endpoint_url(hook, config.bind),
                                              ca_bundle(hook)):
                kube.set_webhooks(obj)
        if hook.cert:  # files mounted from a Secret: a renewal restarts us (cert_watch.py)
            files = [f for f in (hook.cert, hook.key) if f]
            memo.cert_watch = asyncio.create_task(watch_certificate(
                files, lambda _why: os.kill(os.getpid(), signal.SIGTERM),
                hook.cert_check_seconds))


async def _stop_when_admission_ends(admission: AdmissionProcess) -> None:
    """An operator whose webhooks are not served refuses every GRPOJob write: stop, for
    Kubernetes to restart the pod (and with it the admission process)."""
    while admission.exitcode is None:
        await asyncio.sleep(ADMISSION_CHECK_S)
    log.error("the admission process ended (exit code %s); stopping the operator for it "
              "to be started again", admission.exitcode)
    os.kill(os.getpid(), signal.SIGTERM)


@kopf.on.cleanup()
async def operator_cleanup(memo: kopf.Memo, **_: Any) -> None:
    for task in ("cert_watch", "admission_watch"):
        watcher = memo.get(task)
        if watcher is not None:
            watcher.cancel()
    admission: AdmissionProcess | None = memo.get(ADMISSION_KEY)
    if admission is not None:
        admission.stop()
        manage = from_memo(memo).webhook.manage
        if manage:  # as Kopf did: no webhook left behind that refuses every write
            for obj in cleared_configurations(manage):
                kube.set_webhooks(obj)
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
              "the webhook, in managed webhook configurations (--webhook-manage).")
@click.option("--webhook-cert", type=click.Path(exists=True), default=None,
              help="Serving certificate of the webhook (PEM), for --webhook-host or the "
              "chart's Service; needed with --webhook-port.")
@click.option("--webhook-cert-check", type=click.FloatRange(min=0.1), default=CHECK_INTERVAL_S,
              show_default=True, help="Seconds between looks at --webhook-cert and "
              "--webhook-key: once renewed (cert-manager, a chart upgrade), the operator "
              "restarts itself (within one more interval) to serve the new certificate.")
@click.option("--webhook-key", type=click.Path(exists=True), default=None)
@click.option("--webhook-ca", type=click.Path(exists=True), default=None,
              help="CA of --webhook-cert, for the caBundle of managed webhook configurations.")
@click.option("--webhook-manage", default=None, help="Let the operator create and keep the "
              "webhook configurations of this name (dev and the testbed; the chart makes its own).")
@click.option("--trainer-image", default=DEFAULT_TRAINER_IMAGE, show_default=True,
              help="Trainer image for jobs that do not set spec.image.")
@click.option("--trainer-pod-uid", envvar="GRPO_TRAINER_POD_UID", type=PodUid(),
              default=str(IMAGE_UID), show_default=True,
              help="runAsUser, runAsGroup and fsGroup of the pods made from the trainer "
              "image (Ray pods, the model-config reader); 'unset' leaves them for the "
              "platform to assign (OpenShift restricted-v2), runAsNonRoot stays "
              "[env GRPO_TRAINER_POD_UID].")
@click.option("--gpu-catalog", envvar="GRPO_GPU_CATALOG", type=click.Path(dir_okay=False),
              default=None, help="YAML mapping of GPU types merged over the built-in catalog "
              "(the chart's gpuCatalog value) [env GRPO_GPU_CATALOG].")
@click.option("--pod-create-deadline", type=click.FloatRange(min=0), default=300.0,
              show_default=True, help="Seconds a Ray pod the API server keeps refusing "
              "(admission, quota) may take before the attempt fails with the refusal.")
@click.option("--hang-grace", type=click.FloatRange(min=0), default=HANG_GRACE_S,
              show_default=True, help="Seconds past a Running attempt's progress deadline "
              "(the stall timeout, or 5 x its step) before the operator ends it as Hang.")
@click.option("--peering", default=None, help="Kopf peering name: one active replica.")
@click.option("--priority", type=int, default=None,
              help="Peering priority: a replica pauses while one of higher priority runs. "
              "Default: derived from the start time, so that the oldest replica reconciles "
              "and the others stand by (serving admission only).")
@click.option("--peering-lifetime", type=click.IntRange(min=MIN_PEERING_LIFETIME_S),
              default=PEERING_LIFETIME_S, show_default=True,
              help="Seconds a replica's peering keep-alive stays valid: a standby replica "
              "takes over at most this long after the active one dies.")
@click.option("--discovery-timeout", type=click.FloatRange(min=0), default=DISCOVERY_TIMEOUT_S,
              show_default=True, help="Seconds to wait at start for API discovery to list "
              "GRPOJobs, pods and RayClusters (a CRD just installed) before exiting.")
@click.option("--watch-stale-after", type=click.FloatRange(min=1),
              default=WATCH_STALE_AFTER_S, show_default=True,
              help="/healthz fails once GRPOJobs, pods or RayClusters have had no live watch "
              "stream for this many seconds (Kopf renews an idle watch every 70 s).")
@click.option("--read-public-hub/--no-read-public-hub", envvar="GRPO_READ_PUBLIC_HUB",
              default=True, show_default=True,
              help="GET a hub model's config.json from the public hub (huggingface.co) for "
              "jobs that name no spec.hub.endpoint. Off: those jobs plan from the known "
              "table, and a model it does not know needs spec.model.shape "
              "[env GRPO_READ_PUBLIC_HUB].")
@click.option("--hub-endpoints", envvar="GRPO_HUB_ENDPOINTS", default=None, metavar="JSON",
              help="The hubs a job may name in spec.hub.endpoint (mirrors, proxies), as a "
              'JSON object of names to URLs, e.g. {"mirror": "https://hf-mirror.internal"}: '
              "a job names one, or writes one of these URLs; any other is refused, and no "
              "hub but these and the public one (--read-public-hub) is read. Default: none "
              "(the chart's hubEndpoints) [env GRPO_HUB_ENDPOINTS].")
@click.option("--job-network-policy", envvar="GRPO_JOB_NETWORK_POLICY", default=None,
              metavar="JSON", help="Give each job's Ray pods a NetworkPolicy: only the job's "
              "own pods (and the ingressFrom peers) reach them; with egress rules, they "
              "reach only the job's pods, DNS and those rules. JSON: "
              '{"ingressFrom": [peer, ...], "egress": [rule, ...] or null} '
              "(the chart's jobNetworkPolicy) [env GRPO_JOB_NETWORK_POLICY].")
@click.option("--job-defaults", envvar="GRPO_JOB_DEFAULTS", default=None, metavar="JSON",
              help="What every job inherits where it sets nothing: image, tolerations, "
              "nodeSelector, priorityClassName, storageClass, devices, queueName; for one "
              "namespace under namespaces.<name>. A job's own fields win. JSON, e.g. "
              '{"priorityClassName": "training", "namespaces": {"team-a": {"queueName": '
              '"team-a"}}} (the chart\'s jobDefaults) [env GRPO_JOB_DEFAULTS].')
@click.option("--verbose", is_flag=True)
def cli(namespaces: tuple[str, ...], kubeconfig: str | None, bind: str, metrics_port: int,
        webhook_port: int, webhook_host: str | None, webhook_cert: str | None,
        webhook_cert_check: float,
        webhook_key: str | None, webhook_ca: str | None, webhook_manage: str | None,
        trainer_image: str, trainer_pod_uid: int | None, gpu_catalog: str | None,
        pod_create_deadline: float,
        hang_grace: float, peering: str | None, priority: int | None,
        peering_lifetime: int, discovery_timeout: float,
        watch_stale_after: float, read_public_hub: bool, hub_endpoints: str | None,
        job_network_policy: str | None, job_defaults: str | None, verbose: bool) -> None:
    """Reconcile GRPOJobs into KubeRay RayClusters, watch them, and report status."""
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    if kubeconfig:
        os.environ["KUBECONFIG"] = kubeconfig  # also for Kopf's own login
    try:
        catalog = load_catalog(gpu_catalog)
    except CatalogError as exc:
        raise click.BadParameter(str(exc), param_hint="--gpu-catalog") from None
    try:
        network_policy = (parse_job_network_policy(job_network_policy)
                          if job_network_policy else None)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--job-network-policy") from None
    try:
        hubs = parse_hub_endpoints(hub_endpoints) if hub_endpoints else {}
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--hub-endpoints") from None
    try:
        defaults = parse_job_defaults(job_defaults) if job_defaults else NO_JOB_DEFAULTS
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--job-defaults") from None
    if webhook_port and not (webhook_cert and webhook_key):
        raise click.BadParameter(
            "--webhook-port needs --webhook-cert and --webhook-key: the API server calls "
            "webhooks over TLS only (the chart mounts them from its Secret; for development, "
            "a certificate for --webhook-host signed by the --webhook-ca you give)",
            param_hint="--webhook-cert")
    config = OperatorConfig(
        default_image=trainer_image, job_defaults=defaults, trainer_pod_uid=trainer_pod_uid,
        catalog=MappingProxyType(catalog), kubeconfig=kubeconfig,
        bind=bind, metrics_port=metrics_port, pod_create_deadline_seconds=pod_create_deadline,
        hang_grace_seconds=hang_grace,
        discovery_timeout_seconds=discovery_timeout, watch_stale_after_seconds=watch_stale_after,
        read_public_hub=read_public_hub, hub_endpoints=MappingProxyType(hubs),
        peering_lifetime_seconds=peering_lifetime,
        job_network_policy=network_policy,
        webhook=WebhookConfig(port=webhook_port, host=webhook_host, cert=webhook_cert,
                              cert_check_seconds=webhook_cert_check,
                              key=webhook_key, ca=webhook_ca, manage=webhook_manage))
    memo = kopf.Memo()
    if webhook_port:  # forked now, before any thread runs (admission_process.py)
        shared = hub_config.shared_directory(Path(tempfile.gettempdir()))
        atexit.register(shutil.rmtree, shared, ignore_errors=True)
        hub_config.share_between_processes(shared)  # config.json read at apply, planned
        memo[ADMISSION_KEY] = AdmissionProcess.start(config)
    if priority is None:
        priority = replica_priority(time.time(), random.randrange(SALT_RANGE))
    see_listed_namespaces()
    tracker = WatchTracker()
    track_watches(tracker)
    # Our own Insights (what Kopf serves) so that /healthz knows how many namespaces
    # are watched; kopf.run takes it as a keyword, its type is Kopf's own.
    insights = Insights()
    try:
        memo.update({MEMO_KEY: config, TRACKER_KEY: tracker, INSIGHTS_KEY: insights})
        kopf.run(
            memo=memo,
            clusterwide=not namespaces,
            namespaces=list(namespaces),
            standalone=peering is None,
            peering_name=peering,
            priority=priority,
            insights=insights,
        )
    except Exception as exc:
        # A start-up handler refused to go on (discovery never listed our CRD): Kopf
        # raises its ActivityError from our PermanentError. One line with the reason and a
        # non-zero exit, for Kubernetes to act on.
        if isinstance(exc.__cause__, kopf.PermanentError):
            sys.exit(f"grpo-operator: start-up failed: {exc.__cause__}")
        raise


def main() -> None:
    shrink_tls_read_buffers()
    heap_report.install()
    cli()
