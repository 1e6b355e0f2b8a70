"""The path a platform team takes, for real: push the operator image to a registry, install
the chart from that registry, and the node pulls it. The testbed's registry (CNCF
distribution, grpo_testbed/registry.py) takes podman's push on the host side of the node's
veth; the real node's containerd pulls from it (plain HTTP, its hosts.toml).

The node starts with an image store of its own holding only the sandbox image
(``own_image_store``): the shared store holds the ctr-imported operator image, whose
unpacked layers containerd would reuse (same diff IDs) without fetching a byte,
pullPolicy Always or not. So the pod can only run if the registry serves the layers, and
the registry's access log shows the node fetching each one it lacks: all but the Debian
base layer, which the sandbox image, built from the same base, brought (seen: a first
version of this test expected every layer, and the node skipped that one, as a node
that already ran another image from the same base would).

The install is the one docs/deployment.md gives a platform team: `global.imageRegistry=
<registry>` with the chart's default repositories (`grpo-operator/operator`, the path
the image is pushed under), and `image.pullPolicy=Always`."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from grpo_testbed.images import OPERATOR
from grpo_testbed.launcher import Testbed, running_testbed
from grpo_testbed.node.images import SANDBOX_TAG
from grpo_testbed.node.runtime import NODE_NAME
from grpo_testbed.processes import wait_until
from grpo_testbed.registry import push_image, repository, tag_of
from grpo_testbed.tiny_job import CHART

pytestmark = pytest.mark.e2e

RELEASE = "grpo"
MANIFEST_TYPES = ", ".join((
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
))


def events(tb: Testbed, ns: str, pod: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = tb.get_json(
        "events", "-n", ns, "--field-selector", f"involvedObject.name={pod}")["items"]
    return items


def node_requests(tb: Testbed, method: str, path: str) -> list[str]:
    """The registry's access-log lines for ``method path`` sent by the real node."""
    assert tb.net is not None and tb.image_registry is not None
    return [line for line in tb.image_registry.access_log()
            if line.startswith(f"{tb.net.node_ip} ") and f'"{method} {path} ' in line]


def diff_ids(local_tag: str) -> list[str]:
    """The uncompressed layer digests of a local (podman) image, base first."""
    out = subprocess.run(["podman", "image", "inspect", "--format",
                          "{{json .RootFS.Layers}}", local_tag], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    layers: list[str] = json.loads(out)
    return layers


def shared_prefix(a: list[str], b: list[str]) -> int:
    """How many base layers two images share: containerd unpacks a layer once per chain
    of layers below it, and fetches no layer whose chain it has unpacked."""
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.fixture(scope="module")
def tb() -> Iterator[Testbed]:
    """The control plane, KubeRay, Kueue, the registry, and the real node with an empty
    image store of its own (only the sandbox image is imported into it)."""
    with running_testbed(real_node=True, own_image_store=True) as t:
        yield t


@pytest.fixture(scope="module")
def pushed(tb: Testbed) -> str:
    """The operator image, pushed by podman: ``<registry>/grpo-operator/operator@sha256:``."""
    return push_image(OPERATOR.tag, tb.registry)


@pytest.fixture(scope="module")
def release(tb: Testbed, pushed: str) -> Iterator[str]:
    """`helm install` from the registry; --wait: the Deployment is Available, so the node
    pulled the image, started it and its probes pass."""
    ns = tb.namespace("grpo-system")
    # The default image.repository; trainerImage's default goes behind the registry too
    # (not pushed, 7 GB: the operator only writes it into RayClusters, none here).
    tb.helm("install", RELEASE, str(CHART), "-n", ns,
            "--set", f"global.imageRegistry={tb.registry}",
            "--set", f"image.tag={tag_of(OPERATOR.tag)}",
            # Never the node's copy: the kubelet asks the registry at every start.
            "--set", "image.pullPolicy=Always",
            "--set", "leaderElection.enabled=false", "--set", "replicaCount=1",
            "--set", "readPublicHub=false",  # nothing leaves the testbed
            "--wait", "--timeout", "360s", timeout=420)
    yield ns
    tb.helm("uninstall", RELEASE, "-n", ns, "--wait", "--timeout", "120s", check=False)
    tb.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_the_operator_runs_from_the_image_the_node_pulled_from_the_registry(
        tb: Testbed, pushed: str, release: str) -> None:
    pods = tb.get_json("pods", "-n", release)["items"]
    (pod,) = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    name = pod["metadata"]["name"]
    container = pod["spec"]["containers"][0]
    assert pod["spec"]["nodeName"] == NODE_NAME
    pushed_as = f"{tb.registry}/{repository(OPERATOR.tag)}:{tag_of(OPERATOR.tag)}"
    assert container["image"] == pushed_as, (
        "the chart's default image.repository behind global.imageRegistry is no longer the "
        f"path the image is built and pushed under ({pushed_as})")
    assert container["imagePullPolicy"] == "Always"
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] and status["restartCount"] == 0, status
    # The runtime's digest reference of what it runs: the manifest podman pushed.
    assert status["imageID"] == pushed, status

    pulled = [e["message"] for e in events(tb, release, name) if e["reason"] == "Pulled"]
    assert any(m.startswith(f'Successfully pulled image "{container["image"]}"')
               for m in pulled), pulled
    print(f"\nnode pull: {pulled}")  # the time and size, for docs/benchmarks.md

    # Every layer the node did not have came over the wire from the registry.
    repo = repository(OPERATOR.tag)
    digest = pushed.rsplit("@", 1)[1]
    assert tb.image_registry is not None
    manifest = json.loads(tb.image_registry.get(f"/v2/{repo}/manifests/{digest}",
                                                accept=MANIFEST_TYPES))
    layers = [layer["digest"] for layer in manifest["layers"]]
    config = json.loads(tb.image_registry.get(f"/v2/{repo}/blobs/{manifest['config']['digest']}"))
    had = shared_prefix(config["rootfs"]["diff_ids"], diff_ids(SANDBOX_TAG))
    assert had < len(layers), "the node's store had every layer: nothing to pull"
    for layer in layers[had:]:
        lines = node_requests(tb, "GET", f"/v2/{repo}/blobs/{layer}")
        assert any('" 200 ' in line for line in lines), (
            f"the node never fetched layer {layer} from the registry; the node's "
            f"requests:\n" + "\n".join(line for line in tb.image_registry.access_log()
                                        if tb.net and line.startswith(tb.net.node_ip)))


def test_an_image_the_registry_lacks_fails_to_pull_saying_not_found(
        tb: Testbed, pushed: str) -> None:
    """The same repository, a tag nobody pushed: the node asks the registry, which answers
    404, and the pod waits in ErrImagePull / ImagePullBackOff saying "not found"."""
    ns = tb.namespace("pull")
    tag = f"not-pushed-{os.urandom(3).hex()}"
    image = f"{tb.registry}/{repository(OPERATOR.tag)}:{tag}"
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "missing", "namespace": ns},
        "spec": {"restartPolicy": "Never", "nodeName": NODE_NAME,
                 "containers": [{"name": "c", "image": image, "imagePullPolicy": "Always",
                                 "command": ["true"]}]},
    }
    tb.apply(pod)
    seen: dict[str, Any] = {}

    def pull_failed() -> bool:
        statuses = tb.get_json("pod", "missing", "-n", ns).get("status", {}).get(
            "containerStatuses") or [{}]
        waiting = statuses[0].get("state", {}).get("waiting", {})
        failed = [e["message"] for e in events(tb, ns, "missing") if e["reason"] == "Failed"]
        seen.update(waiting=waiting, failed=failed)
        return waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") and bool(failed)

    try:
        wait_until(f"pod with {image} failing to pull", pull_failed, 120)
    finally:
        tb.kubectl("delete", "namespace", ns, "--wait=false", check=False)
    said = " ".join([seen["waiting"].get("message", ""), *seen["failed"]])
    assert image in said and "not found" in said, yaml.safe_dump(seen)
    # The registry answered it (not a refused connection or a TLS error): a 404 to the node.
    asked = (node_requests(tb, "HEAD", f"/v2/{repository(OPERATOR.tag)}/manifests/{tag}")
             + node_requests(tb, "GET", f"/v2/{repository(OPERATOR.tag)}/manifests/{tag}"))
    assert asked and all('" 404 ' in line for line in asked), asked
