"""`grpo`: the operator-side command line (plan, crd, ...)."""

from __future__ import annotations

import click

from . import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="grpo")
def cli() -> None:
    """GRPO Operator: plan GRPOJobs and generate the GRPOJob CRD."""


def main() -> None:
    cli()
