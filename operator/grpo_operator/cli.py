"""`grpo`: the operator-side command line (plan, crd, ...)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from . import __version__

# Both commands that read the GPU catalog take the operator's catalog file (chart gpuCatalog).
GPU_CATALOG_OPTION = click.option(
    "--gpu-catalog",
    envvar="GRPO_GPU_CATALOG",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="GPU types merged over the built-in catalog, as the operator's (chart gpuCatalog).",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="grpo")
def cli() -> None:
    """GRPO Operator: plan GRPOJobs, generate the GRPOJob CRD and Kueue's ResourceFlavors."""


@cli.command()
@click.option(
    "--write",
    is_flag=True,
    help="Write crds/grpojob.yaml, the chart's copy and the chart's trainer-status rule "
    "(charts/grpo-operator/files/trainer-status-rule.cel) instead.",
)
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Repository root for --write.",
)
def crd(write: bool, root: Path) -> None:
    """Print the GRPOJob CRD generated from the API models."""
    from .crd import crd_yaml, write_crds
    from .status_policy import write_rule

    if write:
        for path in [*write_crds(root), write_rule(root)]:
            click.echo(f"wrote {path}")
    else:
        click.echo(crd_yaml(), nl=False)


@cli.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--output", "-o", type=click.Choice(["table", "json", "yaml"]), default="table",
    show_default=True,
)  # fmt: skip
@click.option(
    "--model-root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="A local copy of the model's volume, where config.json is read. For a model on a "
    "claim (spec.model.claimName, mounted at /models in the pods): the claim's files "
    "(/models/sft is read from DIR/sft, or DIR/models/sft). For another absolute path: "
    "DIR/<path>.",
)
@click.option(
    "--hub-token",
    envvar="HF_TOKEN",
    show_envvar=True,
    default=None,
    help="Token for a private or gated hub repo: sent, as the operator's reader pod sends "
    "the Secret's, for a job that sets spec.hub.tokenSecret. Never printed.",
)
@click.option(
    "--offline",
    is_flag=True,
    envvar=["GRPO_PLAN_OFFLINE", "HF_HUB_OFFLINE"],
    show_envvar=True,
    help="Read no hub: a hub model plans from the known table, as under an operator that "
    "cannot reach the hub (the chart's readPublicHub: false). Default: read each hub "
    "model's config.json as the operator does.",
)
@click.option(
    "--hub-endpoints",
    envvar="GRPO_HUB_ENDPOINTS",
    show_envvar=True,
    default=None,
    metavar="JSON",
    help="The cluster's hub endpoints (the chart's hubEndpoints), for a job whose "
    'spec.hub.endpoint names one: {"mirror": "https://hf-mirror.internal"}. A URL there '
    "is read as it is.",
)
@click.option(
    "--job-defaults",
    envvar="GRPO_JOB_DEFAULTS",
    show_envvar=True,
    default=None,
    metavar="JSON",
    help="The cluster's job defaults (the chart's jobDefaults), applied where the job sets "
    "nothing, as the operator applies them; each inherited field is named on stderr.",
)
@click.option(
    "--namespace", "-n",
    default=None,
    help="The namespace the job goes to, for its jobDefaults.namespaces entry. Default: "
    "the job's metadata.namespace, else default.",
)
@GPU_CATALOG_OPTION
def plan(file: Path, output: str, model_root: Path | None, hub_token: str | None,
         offline: bool, hub_endpoints: str | None, job_defaults: str | None,
         namespace: str | None, gpu_catalog: Path | None) -> None:
    """Plan the memory settings and cluster for every GRPOJob in FILE, checked as the API
    server and the webhook check it (other documents are named in a warning), each model
    sized from its config.json read as the operator reads it: the hub's, or a local copy
    of a claim (--model-root). Exit 2 if any is refused. JSON output is one object, or a
    list when FILE holds several jobs."""
    from rich.console import Console

    from grpo_api.job import SpecError

    from .hub_endpoints import parse_hub_endpoints
    from .job_defaults import NO_JOB_DEFAULTS, parse_job_defaults
    from .plan_cli import plan_file
    from .plan_model import HubAccess

    try:
        hubs = parse_hub_endpoints(hub_endpoints) if hub_endpoints else {}
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--hub-endpoints") from None
    try:
        defaults = parse_job_defaults(job_defaults) if job_defaults else NO_JOB_DEFAULTS
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--job-defaults") from None
    try:
        # Piped or captured output gets a fixed, wide layout instead of 80 columns.
        width = None if sys.stdout.isatty() else 140
        refused = plan_file(file, output, model_root, Console(width=width), gpu_catalog,
                            HubAccess(hub_token or None, offline, hubs), defaults, namespace)
    except (SpecError, ValueError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if refused:
        sys.exit(2)


@cli.command("kueue-flavors")
@GPU_CATALOG_OPTION
def kueue_flavors(gpu_catalog: Path | None) -> None:
    """Print Kueue ResourceFlavors for every GPU type (pipe to kubectl apply -f -)."""
    import yaml

    from .catalog_file import load_catalog
    from .kueue_flavors import resource_flavors

    click.echo(yaml.safe_dump_all(resource_flavors(load_catalog(gpu_catalog)),
                                  sort_keys=False), nl=False)


def main() -> None:
    cli()
