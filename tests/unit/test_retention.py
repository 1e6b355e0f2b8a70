"""spec.checkpoint.retention: the operator's checkpoint claim outlives the job (Retain) or
goes with it (Delete); a job created again under the same name adopts the kept claim;
a succeeded job says in status where its exported model is (pure)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from grpo_api.contract import JOB_LABEL, JOB_UID_LABEL
from grpo_api.job import parse_spec
from grpo_operator import reconcile as rec
from grpo_operator.config import OperatorConfig
from grpo_operator.reconcile import Action, Observed
from grpo_operator.reconcile.retention import DELETE_ADVICE, RETAIN_ADVICE, claim_change
from grpo_operator.render import JobRef
from grpo_operator.webhook import admission_problem
from grpo_testbed.status_patch import apply_status_patch

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
T0 = "2026-11-21T10:00:00.000Z"
CONFIG = OperatorConfig()
JOB = JobRef("j", "ns", "uid-new")
OWNER = {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob", "name": "j"}


def new_job(**checkpoint: Any) -> dict[str, Any]:
    spec = yaml.safe_load((EXAMPLES / "grpojob-qwen25vl-7b-a100-40gb.yaml").read_text())["spec"]
    spec["checkpoint"] = {"size": "200Gi", **checkpoint}
    return {"apiVersion": "grpo.dev/v1alpha1", "kind": "GRPOJob",
            "metadata": {"name": JOB.name, "namespace": JOB.namespace, "uid": JOB.uid,
                         "generation": 1, "resourceVersion": "1"},
            "spec": spec, "status": {}}


def step(job: dict[str, Any], event: Any, observed: Observed | None = None
         ) -> tuple[dict[str, Any], Action]:
    """Decide, then merge the status patch as the API server would, CRD schema checked."""
    action = rec.reconcile(job, observed or Observed(), event, T0, CONFIG)
    out = copy.deepcopy(job)
    out["status"] = apply_status_patch(out["status"], action.status)
    return out, action


def claim_of(action: Action) -> dict[str, Any]:
    return next(c for c in action.children if c["kind"] == "PersistentVolumeClaim")


def kept_claim(uid: str = "uid-old", **meta: Any) -> dict[str, Any]:
    """The claim an earlier job of this name left, as the API server returns it."""
    return {"metadata": {"name": "j-checkpoints", "namespace": "ns", "resourceVersion": "7",
                         "labels": {JOB_LABEL: "j", JOB_UID_LABEL: uid}, **meta},
            "spec": {"accessModes": ["ReadWriteMany"]}}


# ---- the claim as rendered -------------------------------------------------------------

def test_retain_is_the_default_and_renders_a_claim_no_job_owns() -> None:
    _, action = step(new_job(), rec.SpecChanged())
    meta = claim_of(action)["metadata"]
    assert "ownerReferences" not in meta  # garbage collection never deletes it
    assert meta["labels"][JOB_LABEL] == "j" and meta["labels"][JOB_UID_LABEL] == "uid-new"
    # Every other child still goes with the job.
    for child in action.children:
        if child["kind"] != "PersistentVolumeClaim":
            assert child["metadata"]["ownerReferences"][0]["uid"] == "uid-new", child["kind"]


@pytest.mark.parametrize("checkpoint", [{"retention": "Delete"}, {"deleteClaimWithJob": True}],
                         ids=["retention-delete", "deprecated-deleteClaimWithJob"])
def test_delete_renders_the_claim_owned_by_the_job(checkpoint: dict[str, Any]) -> None:
    _, action = step(new_job(**checkpoint), rec.SpecChanged())
    meta = claim_of(action)["metadata"]
    assert meta["ownerReferences"] == [{**OWNER, "uid": "uid-new", "controller": True,
                                        "blockOwnerDeletion": True}]
    assert meta["labels"][JOB_UID_LABEL] == "uid-new"


def test_the_deprecated_field_is_named_at_apply() -> None:
    spec = new_job(deleteClaimWithJob=True)["spec"]
    assert any("deleteClaimWithJob is deprecated" in w and "retention: Delete" in w
               for w in parse_spec(spec).deprecation_warnings())


# ---- adopting a kept claim -------------------------------------------------------------

def test_a_job_created_again_adopts_the_kept_claim_and_relabels_it() -> None:
    job, action = step(new_job(), rec.SpecChanged(), Observed(claim=kept_claim()))
    change = action.claim_change
    assert change is not None and change.name == "j-checkpoints"
    assert change.patch == {"metadata": {"resourceVersion": "7", "labels": {
        JOB_LABEL: "j", JOB_UID_LABEL: "uid-new"}}}  # no owner added: still kept
    kind, _, message = next(e for e in action.events if e[1] == "ClaimAdopted")
    assert kind == "Normal" and "uid-old" in message and "j-checkpoints" in message
    assert job["status"]["phase"] == "Pending" and action.children  # the attempt starts


def test_a_delete_job_takes_ownership_of_the_claim_it_adopts() -> None:
    stale = {**OWNER, "uid": "uid-older", "controller": True, "blockOwnerDeletion": True}
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "c1"}
    change = claim_change(parse_spec(new_job(retention="Delete")["spec"]), JOB,
                          kept_claim(ownerReferences=[stale, other]))
    assert change is not None
    assert change.patch["metadata"]["ownerReferences"] == [
        other, {**OWNER, "uid": "uid-new", "controller": True, "blockOwnerDeletion": True}]


def test_a_claim_an_older_operator_made_owned_is_kept_from_now_on() -> None:
    """Before retention existed the claim was always the job's: an upgraded operator
    (Retain is the default) drops the job's reference, so deleting the job keeps it."""
    mine = {**OWNER, "uid": "uid-new", "controller": True, "blockOwnerDeletion": True}
    claim = kept_claim(ownerReferences=[mine])
    del claim["metadata"]["labels"][JOB_UID_LABEL]
    change = claim_change(parse_spec(new_job()["spec"]), JOB, claim)
    assert change is not None
    assert change.patch["metadata"]["ownerReferences"] == []
    assert change.patch["metadata"]["labels"][JOB_UID_LABEL] == "uid-new"
    assert change.event is not None and change.event[1] == "ClaimRetained"


def test_a_claim_that_already_serves_the_job_is_not_written() -> None:
    assert claim_change(parse_spec(new_job()["spec"]), JOB, kept_claim("uid-new")) is None
    mine = {**OWNER, "uid": "uid-new", "controller": True, "blockOwnerDeletion": True}
    assert claim_change(parse_spec(new_job(retention="Delete")["spec"]), JOB,
                        kept_claim("uid-new", ownerReferences=[mine])) is None
    assert claim_change(parse_spec(new_job()["spec"]), JOB, None) is None  # created as rendered


def test_a_users_claim_changes_only_with_delete() -> None:
    spec = new_job()["spec"]
    spec["checkpoint"] = {"claimName": "mine"}
    users = {"metadata": {"name": "mine", "resourceVersion": "3"},
             "spec": {"accessModes": ["ReadWriteMany"]}}
    assert claim_change(parse_spec(spec), JOB, users) is None  # Retain: never touched
    spec["checkpoint"]["retention"] = "Delete"
    change = claim_change(parse_spec(spec), JOB, users)
    assert change is not None and change.name == "mine"
    assert change.patch == {"metadata": {"resourceVersion": "3", "ownerReferences": [
        {**OWNER, "uid": "uid-new", "controller": False, "blockOwnerDeletion": False}]}}


def test_a_new_job_waits_for_the_pods_of_an_earlier_job_of_its_name() -> None:
    """Their drivers may still write into the checkpoint directory this job adopts."""
    leftover = {"metadata": {"name": "j-a3-head-x", "labels": {JOB_LABEL: "j"}}}
    job, action = step(new_job(), rec.SpecChanged(), Observed(pods=[leftover]))
    assert not action.children and action.retry is not None
    assert job["status"]["phase"] == "Pending"
    progressing = next(c for c in job["status"]["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "WaitingForPreviousJob"
    assert "j-a3-head-x" in progressing["message"]
    # Their cluster's and pods' events are not this job's.
    ready = {"metadata": {"name": "j-a0", "labels": {JOB_LABEL: "j", "grpo.dev/attempt": "0"}},
             "status": {"state": "ready"}}
    assert step(job, rec.ClusterChanged(ready))[1].status == {}
    ended = head(137, {})
    assert step(job, rec.PodChanged(ended, deleted=True))[1].status == {}
    job, action = step(job, rec.SpecChanged(), Observed())  # gone: the job starts
    assert action.children and job["status"]["attempts"]


# ---- the exported model, and advice that keeps the data ---------------------------------

def head(code: int, message: dict[str, Any]) -> dict[str, Any]:
    terminated = {"exitCode": code, "message": json.dumps(message)}
    return {"metadata": {"name": "j-a0-head", "labels": {
                JOB_LABEL: "j", "grpo.dev/attempt": "0", "grpo.dev/role": "head"}},
            "status": {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [
                {"name": "ray-head", "state": {"terminated": terminated}}]}}


def running(**checkpoint: Any) -> dict[str, Any]:
    job, _ = step(new_job(**checkpoint), rec.SpecChanged())
    job, _ = step(job, rec.ClusterChanged({"metadata": {"name": "j-a0", "labels": {
        JOB_LABEL: "j", "grpo.dev/attempt": "0"}}, "status": {"state": "ready"}}))
    assert job["status"]["phase"] == "Running"
    return job


def test_a_succeeded_job_says_where_its_exported_model_is() -> None:
    done = {"reason": "Succeeded", "step": 40, "lastCheckpointStep": 40,
            "detail": "exported step 40 to /checkpoints/ns/j/export",
            "export": {"path": "/checkpoints/ns/j/export", "step": 40}}
    job, _ = step(running(), rec.PodChanged(head(0, done)))
    assert job["status"]["phase"] == "Succeeded"
    assert job["status"]["export"] == {"claimName": "j-checkpoints", "path": "ns/j/export",
                                       "step": 40}
    spec = new_job()["spec"]
    spec["checkpoint"] = {"claimName": "mine"}
    job = running()
    job["spec"] = spec
    job, _ = step(job, rec.PodChanged(head(0, done)))
    assert job["status"]["export"]["claimName"] == "mine"


@pytest.mark.parametrize("export", [None, {"path": "", "step": 3}, {"path": "/x"}, "x"],
                         ids=["absent", "empty-path", "no-step", "not-an-object"])
def test_no_export_is_claimed_without_a_sound_report(export: Any) -> None:
    done: dict[str, Any] = {"reason": "Succeeded", "step": 40, "detail": ""}
    if export is not None:
        done["export"] = export
    job, _ = step(running(), rec.PodChanged(head(0, done)))
    assert job["status"]["phase"] == "Succeeded" and "export" not in job["status"]


@pytest.mark.parametrize(("checkpoint", "advice"), [({}, RETAIN_ADVICE),
                                                    ({"retention": "Delete"}, DELETE_ADVICE)])
def test_a_failure_that_asks_for_a_new_job_says_what_happens_to_the_checkpoints(
        checkpoint: dict[str, Any], advice: str) -> None:
    bad = {"reason": "ConfigError", "step": None, "detail": "model.path: ..."}
    job, _ = step(running(**checkpoint), rec.PodChanged(head(2, bad)))
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and advice in failed["message"]
    assert "delete the job and create it again" in failed["message"]


@pytest.mark.parametrize(("checkpoint", "advice"), [({}, RETAIN_ADVICE),
                                                    ({"retention": "Delete"}, DELETE_ADVICE)])
def test_an_edit_that_needs_a_new_job_says_which_name_keeps_the_checkpoints(
        checkpoint: dict[str, Any], advice: str) -> None:
    old = new_job(**checkpoint)["spec"]
    data = admission_problem({**old, "data": {**old["data"], "maxPromptLength": 1024}}, old)
    assert data is not None and "spec.data cannot change" in data
    assert f"or delete this one and create it again ({advice})" in data
    model = admission_problem({**old, "model": {**old["model"], "path": "/models/x"}}, old)
    assert model is not None and "spec.model cannot change" in model
    assert "under another name" in model and advice not in model
