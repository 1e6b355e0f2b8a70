"""The `testbed` fixture: one real control plane for the whole test session.

A missing prerequisite (Go, or a component that cannot be built) fails the tier with
a message; it never skips.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import partial
from pathlib import Path

import pytest
import yaml

from grpo_testbed.build import BuildError
from grpo_testbed.launcher import Testbed, running_testbed
from grpo_testbed.operator_process import OPERATOR_NS_PREFIX, WEBHOOK_CONFIG, OperatorProcess
from grpo_testbed.processes import wait_until

# A GPU type the operator's catalog file adds (the chart's gpuCatalog value, mounted).
ADDED_GPU = "MI300X-192GB"
ADDED_GPU_ENTRY = {"memoryGiB": 191.5, "productLabel": "AMD-Instinct-MI300X",
                   "hostMemoryGiB": 2048, "cpus": 192, "gpusPerNode": 8}


def delete_namespace(testbed: Testbed, name: str, timeout_s: int = 180) -> None:
    """Delete a test's namespace and wait until nothing in it holds the testbed: its
    GRPOJobs, RayClusters and pods are gone, so their GPUs are free. The namespace object
    itself goes later: the namespace controller starts 5 s after the delete and checks a
    namespace whose pods had a grace period again only after ~16 s (estimate / 2 + 1),
    which no test needs to wait for. If its content will not go (a finalizer nobody
    removes), fail naming what still holds it (objects left, with their finalizers)."""
    testbed.kubectl("delete", "namespace", name, "--wait=false", check=False)
    # Terminating now (nothing new can be created in it): delete its content at once, as
    # the namespace controller would only after 5 s and the pods' grace (fake pods, kwok).
    testbed.kubectl("delete", "grpojobs,rayclusters,pods", "--all", "-n", name,
                    "--wait=false", "--grace-period=0", "--force", check=False)

    def emptied() -> bool:
        left = testbed.kubectl("get", "grpojobs,rayclusters,pods", "-n", name,
                               "--ignore-not-found", "-o", "name", check=False)
        return left.returncode == 0 and not left.stdout.strip()

    try:
        wait_until(f"namespace {name} emptied", emptied, timeout_s)
    except (TimeoutError, RuntimeError) as exc:
        left = testbed.kubectl(
            "get", "grpojobs,rayclusters,pods,jobs", "-n", name, "--ignore-not-found", "-o",
            "custom-columns=KIND:.kind,NAME:.metadata.name,DELETING:.metadata."
            "deletionTimestamp,FINALIZERS:.metadata.finalizers", check=False)
        ns = testbed.kubectl("get", "namespace", name, "-o",
                             "jsonpath={.status.conditions}", check=False)
        pytest.fail(f"namespace {name} not emptied in {timeout_s} s: {exc}\n"
                    f"left:\n{left.stdout}{left.stderr}\nnamespace conditions: {ns.stdout}",
                    pytrace=False)


@pytest.fixture(scope="session")
def added_gpu() -> tuple[str, dict[str, object]]:
    """The GPU type the session's operator has on top of the built-in catalog."""
    return ADDED_GPU, ADDED_GPU_ENTRY


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    logging.getLogger("grpo_testbed").setLevel(logging.INFO)
    try:
        with running_testbed() as tb:
            yield tb
    except BuildError as exc:
        pytest.fail(f"the cluster tier needs the testbed, which could not be built: {exc}\n"
                    "Run `make testbed` (needs Go >= 1.26 and the Go module proxy).",
                    pytrace=False)


@pytest.fixture
def ns(testbed: Testbed) -> Iterator[str]:
    """A fresh namespace, deleted (with everything in it) after the test.

    Deleting matters: the fake GPU nodes are few, and a test's pods holding GPUs
    would starve the next test's pods.
    """
    name = testbed.namespace("t")
    yield name
    delete_namespace(testbed, name)


@pytest.fixture(scope="session")
def grpo_crd(testbed: Testbed) -> Testbed:
    testbed.install_grpojob_crd()
    return testbed


@contextmanager
def operator_with(grpo_crd: Testbed, workdir: Path, *args: str) -> Iterator[OperatorProcess]:
    """The module's operator, with its webhook, started with `args` beside the GPU
    catalog file (as the chart mounts its gpuCatalog value)."""
    catalog = workdir / "gpu-catalog.yaml"
    catalog.write_text(yaml.safe_dump({ADDED_GPU: ADDED_GPU_ENTRY}))
    op = OperatorProcess(grpo_crd, workdir,
                         extra_args=("--gpu-catalog", str(catalog), *args)).start()
    try:
        yield op
    finally:
        op.stop()
        # Without the operator the webhook would refuse every GRPOJob: remove it too.
        for kind in ("validatingwebhookconfiguration", "mutatingwebhookconfiguration"):
            grpo_crd.kubectl("delete", kind, WEBHOOK_CONFIG, "--ignore-not-found", check=False)


@pytest.fixture(scope="session")
def start_operator(grpo_crd: Testbed) -> Callable[..., AbstractContextManager[OperatorProcess]]:
    """operator_with on this testbed: for a module whose operator needs other flags."""
    return partial(operator_with, grpo_crd)


@pytest.fixture(scope="module")
def operator(grpo_crd: Testbed, tmp_path_factory: pytest.TempPathFactory
             ) -> Iterator[OperatorProcess]:
    with operator_with(grpo_crd, tmp_path_factory.mktemp("operator")) as op:
        yield op


@pytest.fixture
def op_ns(testbed: Testbed) -> Iterator[str]:
    """A namespace the operator under test watches; deleted after the test."""
    name = testbed.namespace(OPERATOR_NS_PREFIX)
    yield name
    delete_namespace(testbed, name)
