"""The chart's images and what a platform team sets around them, rendered by the pinned
helm: global.imageRegistry in front of the registry-less defaults, a render refused while
an image names no registry, full references and digests as written, extra env and
volumes for a proxy or CA bundle, and security contexts whose UIDs the platform assigns.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from grpo_api import contract
from grpo_operator.main import cli
from grpo_testbed.chart import CHART, IMAGES, one, render, template

pytestmark = pytest.mark.unit

APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
REGISTRY = "registry.example.com/team"
DIGEST = "sha256:" + "ab" * 32


def pod_spec(values: dict[str, str], images: bool = True) -> dict[str, Any]:
    return dict(one(render(values, images=images), "Deployment")["spec"]["template"]["spec"])


def operator_image(values: dict[str, str]) -> str:
    return str(pod_spec(values, images=False)["containers"][0]["image"])


def trainer_image(values: dict[str, str]) -> str:
    args = pod_spec(values, images=False)["containers"][0]["args"]
    (flag,) = [a for a in args if a.startswith("--trainer-image=")]
    return str(flag.removeprefix("--trainer-image="))


# ---- registries ----------------------------------------------------------------------

def test_the_defaults_without_a_registry_are_refused_naming_the_values_and_the_fix() -> None:
    proc = template({}, check=False, images=False)
    assert proc.returncode != 0
    err = proc.stderr
    assert (f"image.repository (grpo-operator/operator:{APP_VERSION}) and trainerImage "
            "(grpo-operator/trainer:0.1.0) name no registry host") in err, err
    assert "ImagePullBackOff" in err
    for fix in ("make images", "podman push", "docs/deployment.md, Images",
                "global.imageRegistry=<your registry>",
                "set image.repository and trainerImage to full references"):
        assert fix in err, (fix, err)


def test_one_image_without_a_registry_is_named_alone() -> None:
    proc = template({"image.repository": IMAGES["image.repository"]}, check=False,
                    images=False)
    assert proc.returncode != 0
    assert "trainerImage (grpo-operator/trainer:0.1.0) names no registry host" in proc.stderr
    assert "image.repository (" not in proc.stderr
    # A "registry" with no host in it (a Docker Hub organisation) is no registry either.
    proc = template({"global.imageRegistry": "myorg"}, check=False, images=False)
    assert proc.returncode != 0
    assert f"image.repository (myorg/grpo-operator/operator:{APP_VERSION})" in proc.stderr


@pytest.mark.parametrize("registry", [REGISTRY, f"{REGISTRY}/"])
def test_global_image_registry_goes_in_front_of_both_images(registry: str) -> None:
    values = {"global.imageRegistry": registry}
    assert operator_image(values) == f"{REGISTRY}/grpo-operator/operator:{APP_VERSION}"
    assert trainer_image(values) == f"{REGISTRY}/grpo-operator/trainer:0.1.0"
    assert operator_image(values | {"image.tag": "0.1.0-rc1"}) == (
        f"{REGISTRY}/grpo-operator/operator:0.1.0-rc1")


@pytest.mark.parametrize("operator", ["localhost/grpo-operator/operator",
                                      "registry.local:5000/grpo/operator",
                                      "quay.io/acme/grpo-operator"])
def test_references_that_name_a_registry_are_used_as_written(operator: str) -> None:
    trainer = operator.replace("operator", "trainer") + ":2.0"
    for values in ({}, {"global.imageRegistry": REGISTRY}):
        values |= {"image.repository": operator, "trainerImage": trainer}
        assert operator_image(values) == f"{operator}:{APP_VERSION}"
        assert trainer_image(values) == trainer


def test_a_digest_wins_over_the_tag_and_is_kept_behind_the_registry() -> None:
    values = {"global.imageRegistry": REGISTRY, "image.digest": DIGEST, "image.tag": "9.9",
              "trainerImage": f"grpo-operator/trainer@{DIGEST}"}
    assert operator_image(values) == f"{REGISTRY}/grpo-operator/operator@{DIGEST}"
    assert trainer_image(values) == f"{REGISTRY}/grpo-operator/trainer@{DIGEST}"
    full = {"image.repository": "quay.io/acme/operator", "image.digest": DIGEST,
            "trainerImage": f"quay.io/acme/trainer:0.1.0@{DIGEST}"}
    assert operator_image(full | {"global.imageRegistry": REGISTRY}) == (
        f"quay.io/acme/operator@{DIGEST}")
    assert trainer_image(full) == f"quay.io/acme/trainer:0.1.0@{DIGEST}"


def test_the_tests_own_full_references_pass_unchanged() -> None:
    c = pod_spec({})["containers"][0]
    assert c["image"] == f"{IMAGES['image.repository']}:{APP_VERSION}"
    assert f"--trainer-image={IMAGES['trainerImage']}" in c["args"]


# ---- extra env, volumes and mounts ---------------------------------------------------

def test_extra_env_volumes_and_mounts_reach_the_operator_pod() -> None:
    spec = pod_spec({
        "extraEnv[0].name": "HTTPS_PROXY", "extraEnv[0].value": "http://proxy.example:3128",
        "extraEnv[1].name": "SSL_CERT_FILE",
        "extraEnv[1].value": "/etc/grpo-operator/ca/ca.crt",
        "extraEnv[2].name": "HF_TOKEN", "extraEnv[2].valueFrom.secretKeyRef.name": "hub",
        "extraEnv[2].valueFrom.secretKeyRef.key": "token",
        "extraVolumes[0].name": "corp-ca", "extraVolumes[0].configMap.name": "corp-ca-bundle",
        "extraVolumeMounts[0].name": "corp-ca",
        "extraVolumeMounts[0].mountPath": "/etc/grpo-operator/ca",
        "extraVolumeMounts[0].readOnly": "true"})
    (c,) = spec["containers"]
    env = c["env"]
    assert env[-3:] == [
        {"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"},
        {"name": "SSL_CERT_FILE", "value": "/etc/grpo-operator/ca/ca.crt"},
        {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hub", "key": "token"}}}]
    assert {"name": "GRPO_GPU_CATALOG", "value": "/etc/grpo-operator/gpu-catalog.yaml"} in env
    assert c["volumeMounts"][-1] == {"name": "corp-ca", "mountPath": "/etc/grpo-operator/ca",
                                     "readOnly": True}
    assert spec["volumes"][-1] == {"name": "corp-ca", "configMap": {"name": "corp-ca-bundle"}}
    assert {m["name"] for m in c["volumeMounts"]} <= {v["name"] for v in spec["volumes"]}
    default = pod_spec({})
    assert [v["name"] for v in default["volumes"]] == ["tmp", "config", "webhook-tls"]


def test_an_extra_volume_named_like_the_charts_own_is_refused() -> None:
    proc = template({"extraVolumes[0].name": "tmp", "extraVolumes[0].emptyDir.medium": ""},
                    check=False)
    assert proc.returncode != 0
    assert "extraVolumes[0].name: tmp is one of the chart's own volumes" in proc.stderr


# ---- security contexts ---------------------------------------------------------------

POD_DEFAULT = {"runAsNonRoot": True, "runAsUser": 10001, "runAsGroup": 10001,
               "fsGroup": 10001, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_DEFAULT = {"runAsNonRoot": True, "allowPrivilegeEscalation": False,
                     "readOnlyRootFilesystem": True, "privileged": False,
                     "capabilities": {"drop": ["ALL"]},
                     "seccompProfile": {"type": "RuntimeDefault"}}
PLATFORM_UID = {"podSecurityContext.runAsUser": "null", "podSecurityContext.runAsGroup": "null",
                "podSecurityContext.fsGroup": "null", "trainerPods.runAsUser": "null"}


def test_the_security_contexts_default_to_what_the_chart_always_set() -> None:
    spec = pod_spec({})
    assert spec["securityContext"] == POD_DEFAULT
    assert spec["containers"][0]["securityContext"] == CONTAINER_DEFAULT
    assert f"--trainer-pod-uid={contract.IMAGE_UID}" in spec["containers"][0]["args"]


def test_uids_set_to_null_are_left_out_for_the_platform_to_assign() -> None:
    """OpenShift's restricted-v2: no fixed UID, GID or fsGroup on the operator's pod, and
    the operator told to set none on the pods it makes; runAsNonRoot stays."""
    text = template(PLATFORM_UID).stdout
    assert ": null" not in text.split("kind: Deployment", 1)[1].split("\n---", 1)[0]
    spec = pod_spec(PLATFORM_UID)
    assert spec["securityContext"] == {"runAsNonRoot": True,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    (c,) = spec["containers"]
    assert c["securityContext"] == CONTAINER_DEFAULT
    assert "--trainer-pod-uid=unset" in c["args"]
    # Only the key set to null goes; another UID replaces the default.
    only = pod_spec({"podSecurityContext.runAsUser": "null", "trainerPods.runAsUser": "20000",
                     "securityContext.readOnlyRootFilesystem": "false"})
    assert only["securityContext"] == {k: v for k, v in POD_DEFAULT.items()
                                       if k != "runAsUser"}
    assert "--trainer-pod-uid=20000" in only["containers"][0]["args"]
    assert only["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is False


@pytest.mark.parametrize("uid", ["unset", "1000680000"])
def test_the_operator_parses_the_trainer_flags_the_chart_renders(uid: str) -> None:
    values = {"trainerPods.runAsUser": "null" if uid == "unset" else uid}
    args = [a for a in pod_spec(values)["containers"][0]["args"]
            if a.startswith(("--trainer-image=", "--trainer-pod-uid="))]
    assert args == [f"--trainer-image={IMAGES['trainerImage']}", f"--trainer-pod-uid={uid}"]
    ctx = cli.make_context("grpo-operator", args)
    assert ctx.params["trainer_image"] == IMAGES["trainerImage"]
    assert ctx.params["trainer_pod_uid"] == (None if uid == "unset" else int(uid))
