"""`grpo-train`: the trainer command line."""

from __future__ import annotations

import click

from . import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="grpo-train")
def cli() -> None:
    """Run GRPO training for vision-language models on Ray + FSDP2."""


def main() -> None:
    cli()
