"""Each planned setting is declared once (grpo_api.knobs), and that declaration matches
every model that holds the knob: a knob added to a model but not declared, or declared
under a name a model lacks, fails here. And a planned setting travels one channel, the
per-attempt trainer config: one also sent as env, or not sent at all, fails here."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest
from pydantic import BaseModel

from grpo_api.job import load_manifest
from grpo_api.job.resources import MemorySpec
from grpo_api.job.spec import AlgorithmSpec, TrainingSpec
from grpo_api.job.status import PlanStatus
from grpo_api.job.trainer import PLANNED
from grpo_api.knobs import KNOBS, RAY_OBJECT_STORE, ROLLOUT_GPU_MEMORY_UTILIZATION, Knob
from grpo_api.trainer_config import Config
from grpo_operator.planner import plan_memory
from grpo_operator.planner.report import plan_status
from grpo_operator.planner.types import Budget, Settings
from grpo_operator.render.names import JobRef
from grpo_operator.render.trainer_config import trainer_config
from grpo_trainer.config import ENV_OVERRIDES, build_config

pytestmark = pytest.mark.unit
EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("grpojob-*.yaml"))
# Settings fields that are not knobs: the HostOOM ladder's own switch.
# Remediation state, not settings a spec pins or the trainer reads: the pods' memory at
# allocatable (each side's).
NOT_KNOBS = {"pod_memory_at_allocatable", "rollout_pod_memory_at_allocatable"}


def aliases(model: type[BaseModel]) -> dict[str, str]:
    """Wire name -> Python field name."""
    return {(f.alias or name): name for name, f in model.model_fields.items()}


def trainer_field(path: str) -> object:
    section, key = path.split(".")
    return Config.model_fields[section].annotation.model_fields[key]  # type: ignore[union-attr]


def test_every_knob_is_declared_and_every_declaration_names_real_fields() -> None:
    settings = {f.name for f in fields(Settings)} - NOT_KNOBS
    assert sorted(k.setting for k in KNOBS if not k.derived) == sorted(settings)
    for knob in (k for k in KNOBS if k.derived):  # what the planner derives: Budget's
        assert knob.setting in {f.name for f in fields(Budget)} and not knob.pinnable, knob
    assert {k.spec for k in KNOBS if k.pinnable} == set(aliases(MemorySpec)), \
        "every spec.memory field is a pinnable knob, and no other"
    for knob in KNOBS:
        if not knob.pinnable and not knob.derived:  # a spec field, passed through
            section = {"algorithm": AlgorithmSpec, "training": TrainingSpec}[knob.section]
            assert knob.spec in aliases(section), knob
        if knob.pinnable:
            assert knob.section == "memory", knob
        if knob.in_status:
            assert aliases(PlanStatus).get(knob.spec) == knob.setting, knob
    paths = {s.knob: s.path for s in PLANNED}
    assert set(paths) == set(KNOBS) - {RAY_OBJECT_STORE}, "each knob but Ray's sets a path"
    for knob, path in paths.items():
        assert trainer_field(path), knob
        assert path not in ENV_OVERRIDES.values(), f"{knob} has a second channel"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_plan_reaches_status_and_the_config_and_not_the_env(path: Path) -> None:
    spec = load_manifest(path).spec
    plan = plan_memory(spec)
    raw = trainer_config(spec, plan, JobRef("j", "ns", "uid"))
    alone = build_config(raw, environ={})
    assert build_config(raw, environ=plan.env) == alone, "the env changes a setting"
    status = plan_status(plan).to_wire()
    for knob in KNOBS:
        if knob.in_status:
            assert status[knob.spec] == plan.knob_value(knob), knob
    for source in PLANNED:
        assert source.knob is not None
        if source.knob == ROLLOUT_GPU_MEMORY_UTILIZATION and not plan.geometry.is_gpu:
            continue  # a fixed, valid fraction: no GPU memory to share with vLLM
        section, key = source.path.split(".")
        assert getattr(getattr(alone, section), key) == source.knob.trainer_value(
            plan.knob_value(source.knob)), source


def test_values_are_spelled_as_the_trainer_reads_them() -> None:
    init = Knob("rank0_init", "rank0Init")
    assert (init.trainer_value(True), init.trainer_value(False)) == ("rank0", "sharded")
    micro = Knob("micro_batch_size", "microBatchSize")
    assert micro.trainer_value(3) == 3
