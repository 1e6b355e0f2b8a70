"""The product's images, moved from podman's storage into the node's containerd.

No registry is reachable, so an image is saved as an OCI archive and imported with
``ctr`` into containerd's ``k8s.io`` namespace under the same name; pods use
``imagePullPolicy: IfNotPresent`` (or Never). An image already in the store with the
same ID (the config digest) is not imported again.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from ..images import BASE_TAG, ImageError, image_id, image_size, label, run_tool

log = logging.getLogger("grpo_testbed.node")

# The pod sandbox ("pause") image: registry.k8s.io/pause cannot be pulled. A shell that
# waits for its stop signal does the same job for a pod that shares no PID namespace.
SANDBOX_TAG = "localhost/grpo-sandbox:1"
ID_LABEL = "dev.grpo-operator.podman-id"
_SANDBOX_CMD = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"


def ensure_sandbox_image() -> str:
    """Build the sandbox image from the testbed's base image (seconds) unless present."""
    if label(SANDBOX_TAG) is not None:
        return SANDBOX_TAG
    ctr = run_tool(["buildah", "from", "--pull-never", BASE_TAG], "buildah from").strip()
    try:
        run_tool(["buildah", "config", "--entrypoint", f'["/bin/sh", "-c", "{_SANDBOX_CMD}"]',
                  "--cmd", "", ctr], "buildah config")
        run_tool(["buildah", "commit", "--quiet", ctr, SANDBOX_TAG], "buildah commit")
    finally:
        subprocess.run(["buildah", "rm", ctr], capture_output=True, check=False)
    return SANDBOX_TAG


def import_image(ctr: Path, socket: Path, tag: str, scratch: Path) -> float:
    """Make ``tag`` (from podman's storage) available to the node; returns seconds spent."""
    t0 = time.monotonic()
    want = image_id(tag)
    base = [str(ctr), "--address", str(socket), "--namespace", "k8s.io"]
    held = _label(base, tag)
    if held == want:
        return 0.0
    if held is not None:
        # A rebuilt image under the same tag: the import would replace it anyway, so its
        # snapshots go first (--sync: garbage-collected before this returns) rather than
        # sit beside the new ones while it imports (7.5 GB for the trainer; a CI machine
        # that keeps its store between runs ran out of disk).
        run_tool([*base, "images", "rm", "--sync", tag], "ctr images rm")
        log.info("removed the node's previous %s (podman rebuilt it) before importing", tag)
    size = image_size(tag)
    _check_free_space(scratch, tag, size)
    # Uncompressed: gzip would cost more than the copy (the trainer image is 7 GB). An
    # OCI directory streamed into ctr as a tar, not an oci-archive: podman builds an
    # archive in a directory under /var/tmp and then tars it, two copies on disk at once.
    with tempfile.TemporaryDirectory(prefix="image-", dir=scratch) as tmp:
        layout = Path(tmp) / "oci"
        run_tool(["podman", "save", "--quiet", "--uncompressed", "--format", "oci-dir",
                  "-o", str(layout), tag], f"podman save {tag}")
        saved = time.monotonic() - t0
        # The layers' blobs go once unpacked (as CRI's discard_unpacked_layers does for
        # pulls): the node runs containers from the snapshots, and keeping the blobs too
        # held the trainer's 7 GB a second time on a disk CI once ran out of. ctr 2.2
        # offers that only for an import it runs itself (--local), not through the
        # transfer service.
        _stream_import([*base, "images", "import", "--local", "--snapshotter", "overlayfs",
                        "--discard-unpacked-layers", "-"], layout, tag)
    # Which podman image this is: a rebuilt image under the same tag is imported again.
    run_tool([*base, "images", "label", tag, f"{ID_LABEL}={want}"], "ctr images label")
    spent = time.monotonic() - t0
    log.info("imported %s into the node: %.0f MB in %.0f s (%.0f MB/s; podman save %.0f s, "
             "ctr import %.0f s)", tag, size / 1e6, spent, size / 1e6 / max(spent, 1e-9),
             saved, spent - saved)
    return spent


def _label(base: list[str], tag: str) -> str | None:
    for line in run_tool([*base, "images", "ls"], "ctr images ls").splitlines()[1:]:
        fields = line.split()
        if fields and fields[0] == tag:
            for kv in fields[-1].split(","):
                key, _, value = kv.partition("=")
                if key == ID_LABEL:
                    return value
    return None


def _stream_import(ctr_import: list[str], layout: Path, tag: str) -> None:
    with subprocess.Popen(["tar", "-C", str(layout), "-cf", "-", "."],
                          stdout=subprocess.PIPE) as tar:
        done = subprocess.run(ctr_import, stdin=tar.stdout, capture_output=True, text=True,
                              check=False)
        assert tar.stdout is not None
        tar.stdout.close()
    if tar.returncode != 0 or done.returncode != 0:
        raise ImageError(f"ctr import {tag} failed (tar {tar.returncode}, ctr "
                         f"{done.returncode}): {done.stderr.strip()}")


def _check_free_space(scratch: Path, tag: str, size: int) -> None:
    """An import holds the saved layout, containerd's copy and its unpacked snapshot at
    once (the copy is dropped after unpacking): fail with the numbers rather than with a
    full disk halfway through."""
    need = 3 * size
    free = shutil.disk_usage(scratch).free
    if free < need:
        raise ImageError(
            f"importing {tag} ({size / 1e9:.1f} GB) into the node needs about "
            f"{need / 1e9:.0f} GB free on {scratch}'s filesystem; {free / 1e9:.1f} GB is. "
            "Free space (images you no longer need: `podman rmi`; pruning untagged ones "
            "also drops the next build's layer cache) and run again.")
