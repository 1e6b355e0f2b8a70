"""`grpo-train`: the trainer command line.

``grpo-train --config FILE [--set k=v ...]`` trains (``train`` is the default
command, so ``grpo-train train --config FILE`` is the same), resuming from the
newest complete checkpoint in ``checkpoint.dir`` unless ``--no-resume``;
``grpo-train export`` turns a checkpoint into a Hugging Face directory;
``grpo-train make-tiny`` builds a tiny model and dataset (a first job's init container);
``grpo-train score-reward`` tries the config's reward on the first rows of its data.
"""

from __future__ import annotations

import sys

import click

from grpo_api.contract import ExitCode

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
_resume_opt = click.option(
    "--resume/--no-resume",
    default=True,
    show_default=True,
    help="continue from the newest complete checkpoint in checkpoint.dir",
)


def _train(config_path: str | None, overrides: tuple[str, ...], resume: bool) -> None:
    from grpo_api.contract import CONFIG_PATH

    from .run import run_training

    sys.exit(int(run_training(config_path or CONFIG_PATH, list(overrides), resume=resume)))


# What each exit code means, from the enum the operator classifies by (grpo_api.contract).
EXIT_WORDS = {
    ExitCode.FINISHED: "finished", ExitCode.ERROR: "error", ExitCode.CONFIG_ERROR: "bad config",
    ExitCode.CUDA_OOM: "CUDA OOM", ExitCode.HOST_OOM: "host/Ray OOM",
    ExitCode.WORKER_LOST: "worker lost", ExitCode.HANG: "hang (stacks written)",
    ExitCode.CHECKPOINT_INCOMPATIBLE: "checkpoint incompatible",
    ExitCode.TERMINATED: "stopped on SIGTERM after a save",
}
HELP = (
    "Run GRPO training for vision-language models on Ray + FSDP2.\n\n"
    "Without a command, trains with --config (default /etc/grpo/config.yaml).\n"
    "Exit codes: " + ", ".join(f"{int(c)} {EXIT_WORDS[c]}" for c in ExitCode) + "."
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, invoke_without_command=True,
             help=HELP)
@click.version_option(__version__, prog_name="grpo-train")
@_config_opt
@_set_opt
@_resume_opt
@click.pass_context
def cli(
    ctx: click.Context, config_path: str | None, overrides: tuple[str, ...], resume: bool
) -> None:
    if ctx.invoked_subcommand is None:
        _train(config_path, overrides, resume)


@cli.command()
@_config_opt
@_set_opt
@_resume_opt
def train(config_path: str | None, overrides: tuple[str, ...], resume: bool) -> None:
    """Train (the default command)."""
    _train(config_path, overrides, resume)


@cli.command("export")
@click.option(
    "--checkpoint-dir",
    required=True,
    type=click.Path(file_okay=False, exists=True),
    help="checkpoint.dir of a run (holds step-<N>/ and latest)",
)
@click.option("--step", type=int, default=None, help="step to export (default: latest)")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="output directory")
@click.option(
    "--dtype",
    type=click.Choice(["float32", "bfloat16", "float16"]),
    default=None,
    help="weights dtype (default: the original model's)",
)
@click.option(
    "--model-path",
    default=None,
    help="original model directory, if not where the checkpoint's config says",
)
@click.option(
    "--adapter-out",
    default=None,
    type=click.Path(file_okay=False),
    help="LoRA checkpoints: also write the adapters as a PEFT directory here",
)
def export_cmd(
    checkpoint_dir: str,
    step: int | None,
    out: str,
    dtype: str | None,
    model_path: str | None,
    adapter_out: str | None,
) -> None:
    """Write a Hugging Face model directory (safetensors + config + tokenizer) from a checkpoint."""
    import logging

    from .checkpointing.export import ExportError, export

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        done = export(
            checkpoint_dir, out, step=step, model_path=model_path, dtype=dtype,
            adapter_out=adapter_out,
        )
    except ExportError as err:
        click.echo(f"export failed: {err}", err=True)
        sys.exit(1)
    click.echo(f"exported step {done.step} to {done.out} ({done.tensors} tensors)")


@cli.command("make-tiny")
@click.option("--out", required=True, type=click.Path(file_okay=False),
              help="directory to hold model/ and train.parquet")
@click.option("--rows", type=click.IntRange(min=1), default=32, show_default=True,
              help="prompts in the train split")
def make_tiny_cmd(out: str, rows: int) -> None:
    """Build a random-weight tiny Qwen2.5-VL and an EasyR1-layout train split, offline
    (kept if a complete build is already there)."""
    from .tiny import make_tiny

    tiny = make_tiny(out, rows)
    verb = "built" if tiny.built else "kept the earlier build of"
    click.echo(f"{verb} {tiny.model} and {tiny.train}")


@cli.command("validate")
@_config_opt
@_set_opt
def validate(config_path: str | None, overrides: tuple[str, ...]) -> None:
    """Check a config (and its env overrides) and print the resolved YAML."""
    import yaml

    from .config import load_config
    from .config_error import ConfigError

    try:
        cfg = load_config(config_path or "/etc/grpo/config.yaml", list(overrides))
    except ConfigError as err:
        click.echo(f"config error: {err}", err=True)
        sys.exit(2)
    click.echo(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))


@cli.command("score-reward")
@_config_opt
@_set_opt
@click.option("--rows", type=click.IntRange(min=1), default=4, show_default=True,
              help="score the first ROWS rows of data.train_files")
@click.option("--response", default=None,
              help="the response to score (default: each row's own answer)")
def score_reward(config_path: str | None, overrides: tuple[str, ...], rows: int,
                 response: str | None) -> None:
    """Try the config's reward on the first rows of its data before a job runs; exits 1
    when the reward failed on any row (each failure's reason is printed)."""
    import logging

    from .config import load_config
    from .config_error import ConfigError
    from .rewards.trial import score_first_rows

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(config_path or "/etc/grpo/config.yaml", list(overrides))
        trials = score_first_rows(cfg, rows, response)
    except ConfigError as err:
        click.echo(f"config error: {err}", err=True)
        sys.exit(int(ExitCode.CONFIG_ERROR))
    for t in trials:
        r = t.result
        acc = "" if r.accuracy is None else f" accuracy {r.accuracy:g}"
        extra = "".join(f" {k} {v:g}" for k, v in r.extras.items())
        verdict = f"FAILED: {r.failed}" if r.failed else f"score {r.score:g}{acc}{extra}"
        click.echo(f"{t.where}: {verdict}")
    sys.exit(1 if any(t.result.failed for t in trials) else 0)


def main() -> None:
    cli()
