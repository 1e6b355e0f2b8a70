"""`grpo-testbed`: build, start, and use the local Kubernetes testbed."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from . import build
from .launcher import running_testbed
from .versions import COMPONENTS, bin_dir


def _logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)


def _sigterm_as_interrupt() -> None:
    # So `kill <pid>` tears the testbed down through the same path as Ctrl-C.
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True)
def cli(verbose: bool) -> None:
    """A real Kubernetes control plane on 127.0.0.1 with fake GPU nodes and KubeRay."""
    _logging(verbose)


@cli.command("build")
@click.argument("components", nargs=-1)
@click.option("--for-demo", is_flag=True,
              help="Only what `grpo-testbed demo` runs (not Kueue, not the registry).")
def build_cmd(components: tuple[str, ...], for_demo: bool) -> None:
    """Build (or reuse) the pinned components (all of versions.COMPONENTS unless named)."""
    from .demo import DEMO_SKIPS

    t0 = time.monotonic()
    names = list(components) or (
        [c.name for c in COMPONENTS if c.name not in DEMO_SKIPS] if for_demo else None)
    try:
        build.build_all(names)
    except build.BuildError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"testbed build: {time.monotonic() - t0:.1f} s")


@cli.command("images")
@click.argument("names", nargs=-1)
@click.option("--force", is_flag=True, help="Rebuild even if the inputs are unchanged.")
@click.option("--logs", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where the build logs go (default: a temp dir).")
def images_cmd(names: tuple[str, ...], force: bool, logs: Path | None) -> None:
    """Build (or reuse) the product's images into local storage: operator and
    trainer-cpu unless NAMES are given; trainer-gpu (9.3 GB) only when named."""
    from . import images

    t0 = time.monotonic()
    try:
        wanted = images.select(names)
        built = images.build_all(names, force=force, workdir=logs)
    except images.ImageError as exc:
        raise click.ClickException(str(exc)) from exc
    for image in wanted:
        click.echo(f"{image.name:12} {image.tag:44} "
                   f"{images.image_size(image.tag) / 1e9:6.2f} GB"
                   f"{'  (built)' if image in built else ''}")
    click.echo(f"images: {time.monotonic() - t0:.1f} s")


@cli.command("node-images")
def node_images_cmd() -> None:
    """Import the product's images (operator, trainer-cpu) into the real node's image
    store, kept under ~/.cache, with containerd alone: the e2e tier and the demo then
    start their node without the import (minutes for the 7 GB trainer image on a fresh
    machine). hack/setup.sh runs it beside the Go build once the images are built."""
    from .images import OPERATOR, TRAINER_CPU, ImageError
    from .node.preload import preload_store

    t0 = time.monotonic()
    try:
        spent = preload_store((OPERATOR.tag, TRAINER_CPU.tag))
    except (ImageError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from exc
    if spent is None:
        click.echo("the node's image store is in use by a running testbed: its node "
                   "imports what it needs; nothing imported here")
        return
    for tag, seconds in spent.items():
        done = f"imported in {seconds:.0f} s" if seconds else "already in the store"
        click.echo(f"{tag:44} {done}")
    click.echo(f"node images ready in {time.monotonic() - t0:.1f} s")


@cli.command("image-check")
@click.argument("name", default="trainer-gpu")
def image_check_cmd(name: str) -> None:
    """Check a built trainer image (default: trainer-gpu) from inside, with podman: torch,
    vLLM and Ray import, its packages are exactly its lock, torch's CUDA is the lock's
    (which fixes the NVIDIA driver nodes need), the NVIDIA container toolkit's variables
    are set. Needs no GPU."""
    from . import image_check, images

    try:
        (image,) = images.select([name])
        report = image_check.check(image)
    except images.ImageError as exc:
        raise click.ClickException(str(exc)) from exc
    for line in image_check.summary(image, report):
        click.echo(line)
    if report.problems:
        raise click.ClickException("\n".join(report.problems))
    click.echo(f"image-check: OK ({report.seconds:.1f} s)")


@cli.command("versions")
def versions_cmd() -> None:
    """Print each pinned component, its version and where its binaries live."""
    for c in COMPONENTS:
        state = "built" if build.is_built(c) else "not built"
        click.echo(f"{c.name:12} {c.version:10} {state:10} {bin_dir(c)}")


@cli.command("up")
@click.option("--dir", "workdir", type=click.Path(path_type=Path), default=None,
              help="Keep state here instead of a temp dir.")
@click.option("--no-kuberay", is_flag=True, help="Skip the KubeRay operator.")
def up_cmd(workdir: Path | None, no_kuberay: bool) -> None:
    """Start the testbed and keep it running until Ctrl-C or SIGTERM."""
    _sigterm_as_interrupt()
    try:
        with running_testbed(workdir, with_kuberay=not no_kuberay) as tb:
            click.echo(f"export KUBECONFIG={tb.kubeconfig}")
            click.echo(f"export PATH={os.pathsep.join(str(bin_dir(c)) for c in COMPONENTS)}"
                       f"{os.pathsep}$PATH")
            if tb.s3 is not None:  # checkpoint.store's endpoint; make a bucket with mkdir
                click.echo(f"export AWS_ENDPOINT_URL={tb.s3.endpoint} "
                           f"AWS_ACCESS_KEY_ID={tb.s3.access_key} "
                           f"AWS_SECRET_ACCESS_KEY={tb.s3.secret_key}")
                click.echo(f"# S3 buckets are the directories of {tb.s3.root}", err=True)
            click.echo("testbed running; Ctrl-C stops it", err=True)
            while all(p.alive() for p in tb.procs):
                time.sleep(1)
            dead = [p for p in tb.procs if not p.alive()]
            raise click.ClickException(
                f"{dead[0].name} exited; last lines:\n{dead[0].log_tail()}")
    except KeyboardInterrupt:
        click.echo("testbed stopped", err=True)


@cli.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--no-kuberay", is_flag=True, help="Skip the KubeRay operator.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def run_cmd(no_kuberay: bool, command: tuple[str, ...]) -> None:
    """Start the testbed, run COMMAND with KUBECONFIG and PATH set, then stop it."""
    _sigterm_as_interrupt()
    with running_testbed(with_kuberay=not no_kuberay) as tb:
        rc = subprocess.run(list(command), env=tb.env(), check=False).returncode
    sys.exit(rc)


@cli.command("demo")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path),
              default=Path("demo-output"), show_default=True,
              help="Where the trained model is exported (kept after teardown).")
@click.option("--leak-step", type=int, default=None,
              help="Step from which attempt 0's ranks leak host memory until the kernel "
                   "OOM-kills their worker pod (default: the scenario's).")
def demo_cmd(out: Path, leak_step: int | None) -> None:
    """The main job end to end: helm install, a tiny GRPOJob that really trains as a head
    and a worker pod, a real OOM kill of the worker pod, the operator's restart from the
    last checkpoint, Succeeded, the exported model."""
    from .demo import run_demo

    _sigterm_as_interrupt()
    sys.exit(run_demo(out.resolve(), leak_step))


def main() -> None:
    cli()
