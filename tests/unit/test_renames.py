"""Fields renamed in place (api/grpo_api/job/renames.py): a manifest written with the old
names parses to the very spec the new names give, admission warns naming both, both
names set to different values is refused naming both, and a live job's manifest moved
to the new names changes nothing."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from grpo_api.job import SpecError, parse_spec
from grpo_api.job.renames import RENAMES, rename_warnings, with_new_names
from grpo_operator.webhook import admission_problem, admission_warnings
from grpo_testbed.examples import example_job

pytestmark = pytest.mark.unit

NEW = example_job()["spec"]  # the tiny example, written with the new names


def old_form(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` as it was written before the renames."""
    out = copy.deepcopy(spec)
    out["resources"]["gpu"] = out["resources"].pop("gpuType")
    out["restartPolicy"] = {"maxRestarts": out.pop("backoffLimit"), **out.pop("recovery")}
    out["trainer"] = {"warmupSteps": 2, "formatPrompt": "r1v", "rewardWorkers": 3}
    return out


def new_form_with_settings(spec: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(spec)
    out["training"] = {**out["training"], "warmupSteps": 2}
    out["data"] = {**out["data"], "promptTemplate": "r1v"}
    out["reward"] = {**out["reward"], "workers": 3}
    return out


def test_an_old_manifest_parses_to_the_spec_the_new_names_give() -> None:
    assert {"backoffLimit", "recovery"} <= set(NEW) and "gpuType" in NEW["resources"]
    old = old_form(NEW)
    assert parse_spec(old) == parse_spec(new_form_with_settings(NEW))
    parsed = parse_spec(old)
    assert parsed.resources.gpu_type == "cpu" and parsed.max_restarts == 2
    assert parsed.recovery.backoff.initial_seconds == 2 and parsed.restart_policy == "OnFailure"


def test_admission_warns_naming_the_old_and_the_new_name() -> None:
    warned = admission_warnings(old_form(NEW))
    for old, new in (("resources.gpu", "resources.gpuType"),
                     ("restartPolicy.maxRestarts", "backoffLimit"),
                     ("restartPolicy.backoff", "recovery.backoff"),
                     ("trainer.formatPrompt", "data.promptTemplate")):
        assert f"spec.{old} is renamed: write spec.{new} (the old name still works, for now)" \
            in warned, old
    assert not rename_warnings(NEW) and not [w for w in admission_warnings(NEW) if "renamed" in w]


def test_both_names_set_differently_are_refused_naming_both() -> None:
    both = copy.deepcopy(NEW)
    both["resources"]["gpu"] = "H100-80GB"
    with pytest.raises(SpecError) as err:
        parse_spec(both)
    assert "spec: resources.gpu is the old name of resources.gpuType" in str(err.value)
    assert "keep resources.gpuType only" in str(err.value)
    same = copy.deepcopy(NEW)
    same["resources"]["gpu"] = "cpu"  # the same value twice: taken, and warned about
    assert parse_spec(same).resources.gpu_type == "cpu"


def test_restart_policy_never_means_no_restart() -> None:
    spec = parse_spec({**NEW, "restartPolicy": "Never"})
    assert spec.backoff_limit == 2 and spec.max_restarts == 0
    with pytest.raises(SpecError) as err:
        parse_spec({**NEW, "restartPolicy": "Always"})
    assert "spec.restartPolicy" in str(err.value) and "OnFailure" in str(err.value)
    old = {k: v for k, v in NEW.items() if k != "backoffLimit"}
    with pytest.raises(SpecError) as err:
        parse_spec({**old, "restartPolicy": {"maxRestarts": 1, "bogus": 2}})
    assert "spec: restartPolicy.bogus: unknown field" in str(err.value)


def test_a_live_job_moved_to_the_new_names_changes_nothing_but_a_new_value_is_refused(
) -> None:
    old = old_form(NEW)
    assert admission_problem(new_form_with_settings(NEW), old) is None
    changed = new_form_with_settings(NEW)
    changed["training"]["warmupSteps"] = 5
    problem = admission_problem(changed, old)
    assert problem is not None and "spec.training cannot change" in problem, problem


def test_every_old_name_is_still_in_the_crd_schema() -> None:
    """Else the API server would refuse an old manifest (unknown field) or prune it."""
    from grpo_operator.crd import crd

    spec = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for r in RENAMES:
        node = spec
        for key in r.old.split("."):
            if node.get("x-kubernetes-preserve-unknown-fields"):
                break  # an open section (spec.trainer, spec.restartPolicy) keeps any key
            node = node["properties"][key]
        else:
            assert "Deprecated" in node["description"], r.old


def test_with_new_names_leaves_its_input_alone() -> None:
    old = old_form(NEW)
    before = copy.deepcopy(old)
    moved = with_new_names(old)
    assert old == before and "gpu" not in moved["resources"] and "trainer" not in moved
