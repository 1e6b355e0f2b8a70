"""`make demo` builds only what the demo's testbed runs (`grpo-testbed build --for-demo`):
a testbed started without Kueue, the registry or the S3 server neither needs nor builds
them."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from grpo_testbed import build, cli
from grpo_testbed.demo import DEMO_SKIPS
from grpo_testbed.launcher import Testbed
from grpo_testbed.versions import COMPONENTS

pytestmark = pytest.mark.unit


def test_a_testbed_without_kueue_or_the_registry_does_not_build_them(tmp_path: Path) -> None:
    assert Testbed(tmp_path).not_run() == frozenset()
    demo = Testbed(tmp_path, with_kueue=False, with_registry=False, with_s3=False)
    assert demo.not_run() == DEMO_SKIPS == {"kueue", "registry", "versitygw"}
    assert Testbed(tmp_path, with_kuberay=False).not_run() == {"kueue"}  # Kueue needs KubeRay


def test_build_for_demo_names_every_component_but_the_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str] | None] = []
    monkeypatch.setattr(build, "build_all", asked.append)
    result = CliRunner().invoke(cli.cli, ["build", "--for-demo"])
    assert result.exit_code == 0, result.output
    assert asked == [[c.name for c in COMPONENTS if c.name not in DEMO_SKIPS]]
    assert {"kubernetes", "kuberay", "helm", "containerd"} <= set(asked[0] or [])
