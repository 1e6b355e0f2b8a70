"""`grpo-train`: the trainer command line.

``grpo-train --config FILE [--set k=v ...]`` trains (``train`` is the default
command, so ``grpo-train train --config FILE`` is the same); ``export`` (issue 5)
will sit beside it.
"""

from __future__ import annotations

import sys

import click

from . import __version__

_config_opt = click.option(
    "--config", "config_path", type=click.Path(dir_okay=False), help="trainer config YAML"
)
_set_opt = click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY.PATH=VALUE",
    help="override one config value (YAML-parsed); GRPO_* env still wins",
)


def _train(config_path: str | None, overrides: tuple[str, ...]) -> None:
    from grpo_operator.contract import CONFIG_PATH

    from .run import run_training

    sys.exit(int(run_training(config_path or CONFIG_PATH, list(overrides))))


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True)
@click.version_option(__version__, prog_name="grpo-train")
@_config_opt
@_set_opt
@click.pass_context
def cli(ctx: click.Context, config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Run GRPO training for vision-language models on Ray + FSDP2.

    Without a command, trains with --config (default /etc/grpo/config.yaml).
    Exit codes: 0 finished, 1 error, 2 bad config, 3 CUDA OOM, 4 host/Ray OOM,
    5 worker lost.
    """
    if ctx.invoked_subcommand is None:
        _train(config_path, overrides)


@cli.command()
@_config_opt
@_set_opt
def train(config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Train (the default command)."""
    _train(config_path, overrides)


@cli.command("validate")
@_config_opt
@_set_opt
def validate(config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Check a config (and its env overrides) and print the resolved YAML."""
    import yaml

    from .config import ConfigError, load_config

    try:
        cfg = load_config(config_path or "/etc/grpo/config.yaml", list(overrides))
    except ConfigError as err:
        click.echo(f"config error: {err}", err=True)
        sys.exit(2)
    click.echo(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))


def main() -> None:
    cli()
