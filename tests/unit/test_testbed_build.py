"""The throwaway-module recipe that makes k8s.io/kubernetes buildable."""

from __future__ import annotations

from pathlib import Path

import pytest

from grpo_testbed.build import replace_lines
from grpo_testbed.versions import K8S_STAGING_VERSION, KUBERNETES_VERSION

UPSTREAM = """module k8s.io/kubernetes

require (
\tk8s.io/api v0.0.0
\tk8s.io/client-go v0.0.0
)

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go // keep in step
\tgithub.com/foo/bar v1.2.0 => github.com/fork/bar v1.2.1
)

replace go.etcd.io/etcd/api/v3 => ../api
"""


def test_staging_replaces_become_published_versions_and_local_ones_drop() -> None:
    assert replace_lines(UPSTREAM, "v0.36.3") == [
        "k8s.io/api => k8s.io/api v0.36.3",
        "k8s.io/client-go => k8s.io/client-go v0.36.3",
        "github.com/foo/bar v1.2.0 => github.com/fork/bar v1.2.1",
    ]


def test_without_staging_version_local_replaces_are_dropped() -> None:
    assert replace_lines(UPSTREAM, None) == [
        "github.com/foo/bar v1.2.0 => github.com/fork/bar v1.2.1"
    ]


def test_staging_version_follows_the_kubernetes_pin() -> None:
    major_minor_patch = KUBERNETES_VERSION.lstrip("v").split(".")
    assert f"v0.{major_minor_patch[1]}.{major_minor_patch[2]}" == K8S_STAGING_VERSION


def test_the_fault_switch_patches_only_pods_with_all_its_labels() -> None:
    import base64
    import json

    from grpo_testbed.faults import EnvInjection, review_response

    inj = EnvInjection({"grpo.dev/attempt": "0", "grpo.dev/role": "head"},
                       {"GRPO_FAULT_INJECT": "host_oom@step=5"})

    def review(labels: dict[str, str], env: list[dict[str, str]] | None) -> dict[str, object]:
        container: dict[str, object] = {"name": "ray-head"}
        if env is not None:
            container["env"] = env
        obj = {"metadata": {"labels": labels}, "spec": {"containers": [container]}}
        return review_response({"request": {"uid": "u1", "object": obj}}, (inj,))["response"]

    head0 = review({"grpo.dev/attempt": "0", "grpo.dev/role": "head"}, [{"name": "A",
                                                                          "value": "1"}])
    assert head0["uid"] == "u1" and head0["allowed"] is True
    ops = json.loads(base64.b64decode(str(head0["patch"])))
    assert ops == [{"op": "add", "path": "/spec/containers/0/env/-",
                    "value": {"name": "GRPO_FAULT_INJECT", "value": "host_oom@step=5"}}]
    fresh = review({"grpo.dev/attempt": "0", "grpo.dev/role": "head"}, None)
    assert json.loads(base64.b64decode(str(fresh["patch"])))[0]["path"] == \
        "/spec/containers/0/env"
    assert "patch" not in review({"grpo.dev/attempt": "1", "grpo.dev/role": "head"}, None)


def test_excludes_are_read_in_block_and_one_line_form() -> None:
    from grpo_testbed.build import directive_entries

    gomod = """module x
exclude (
\t// why: upstream's comment
\tgithub.com/a/b v1.0.1-0.2018 // pinned away
\tgithub.com/c/d v0.1.0
)
exclude github.com/e/f v2.0.0
replace github.com/g/h => ./local
"""
    assert directive_entries(gomod, "exclude") == [
        "github.com/a/b v1.0.1-0.2018", "github.com/c/d v0.1.0", "github.com/e/f v2.0.0"]
    assert directive_entries(gomod, "replace") == ["github.com/g/h => ./local"]


def test_a_fault_switch_without_the_real_node_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    """Only the real node's pods can carry the switch (its webhook listens on the node's
    veth): asked for without it, the testbed says so instead of running without faults."""
    from grpo_testbed.faults import EnvInjection
    from grpo_testbed.launcher import running_testbed

    switch = EnvInjection({"grpo.dev/attempt": "0"}, {"GRPO_FAULT_INJECT": "host_oom@step=5"})
    with pytest.raises(ValueError, match="real_node=True"), \
            running_testbed(tmp_path / "tb", injections=(switch,)):
        pass
    assert not (tmp_path / "tb").exists()


def test_every_component_program_is_found_where_one_go_build_writes_it() -> None:
    """`go build -o dir/` names a program after its import path's last element, the one
    before a major-version suffix: etcd's `.../server/v3` lands as `server` (checked against
    Go 1.26 by hand) and is renamed to `etcd`; a wrong name would fail a cold build only."""
    from grpo_testbed.build import _program_name
    from grpo_testbed.versions import COMPONENTS

    assert _program_name("go.etcd.io/etcd/server/v3") == "server"
    assert _program_name("k8s.io/kubernetes/cmd/kubectl") == "kubectl"
    etcd = next(c for c in COMPONENTS if c.name == "etcd")
    assert [_program_name(p) for p in etcd.packages] == ["server"]
    # Two programs of one component never land on the same name.
    for c in COMPONENTS:
        names = [_program_name(p) for p in c.packages]
        assert len(set(names)) == len(names), c.name
