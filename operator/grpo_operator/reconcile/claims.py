"""Whether the claims a job names can serve its Ray pods (pure): present, and with an
access mode that lets every pod mount them."""

from __future__ import annotations

from typing import Any

from grpo_api.job import GRPOJobSpec

_MODES_REACH = {"ReadWriteOnce": "one node", "ReadWriteOncePod": "one pod",
                "ReadOnlyMany": "read-only mounts"}


def _one_claim_problem(field: str, claim: str, namespace: str, pvc: dict[str, Any] | None,
                       pods: int, access: str, shared: tuple[str, ...],
                       create_hint: str) -> str | None:
    """Why the claim at `field` cannot be mounted (`access`: read-write or read-only) by
    all `pods` Ray pods: absent, or no access mode that allows it (`shared`: the modes
    that do for pods on several nodes)."""
    if pvc is None:
        return f"{field} {claim!r} does not exist in {namespace}; create it {create_hint}"
    modes = list(pvc.get("spec", {}).get("accessModes") or [])
    ok = set(shared) if pods > 1 else {*shared, "ReadWriteOnce", "ReadWriteOncePod"}
    if ok & set(modes):
        return None
    reach = " and ".join(_MODES_REACH[m] for m in modes if m in _MODES_REACH)
    who = (f"all {pods} Ray pods of this job (the head and its workers, as a rule on "
           "different nodes) mount" if pods > 1 else "the job's one pod mounts")
    return (f"{field} {claim!r} is {','.join(modes) or 'without access modes'}"
            + (f" ({reach} only)" if reach else "")
            + f", but {who} it {access}: use a {' or '.join(shared)} claim")


def claim_problem(spec: GRPOJobSpec, namespace: str,
                  checkpoint_pvc: dict[str, Any] | None, model_pvc: dict[str, Any] | None,
                  pods: int) -> str | None:
    """Why a claim the spec names cannot serve the job's `pods` Ray pods (`*_pvc` is what
    the API server returned for spec.checkpoint.claimName / spec.model.claimName, None if
    absent), or None. Every pod mounts both: checkpoints read-write, so a job of several
    pods needs ReadWriteMany; the model read-only, so ReadOnlyMany will do."""
    ckpt, model = spec.checkpoint.claim_name, spec.model.claim_name
    problem = None
    if ckpt:
        problem = _one_claim_problem(
            "checkpoint.claimName", ckpt, namespace, checkpoint_pvc, pods, "read-write",
            ("ReadWriteMany",), "or set checkpoint.size to let the operator create one")
    if model and not problem:
        problem = _one_claim_problem(
            "model.claimName", model, namespace, model_pvc, pods, "read-only",
            ("ReadOnlyMany", "ReadWriteMany"), "holding the model at model.path")
    return problem
