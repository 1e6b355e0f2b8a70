"""A checkpoint loads under another rung's settings, or says exactly why it cannot.

The layouts are the real ones: a small module stored and given its optimizer by the
code every rank runs (precision.store_params, build_optimizer), its state taken by DCP's
get_state_dict and flattened as DCP flattens it. The load round trips go through real
DCP in one process (no ranks): tests/trainer/test_rung_resume.py does it on 2 FSDP ranks.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.state_dict import get_state_dict

from grpo_api.trainer_config import ActorConfig
from grpo_trainer.checkpointing.compat import (
    HYPERPARAMETERS,
    Entry,
    incompatible_message,
    plan_load,
)
from grpo_trainer.checkpointing.convert import finish, own_entries, prepare, saved_entries
from grpo_trainer.errors import CheckpointIncompatible
from grpo_trainer.model.precision import build_optimizer, store_params

pytestmark = pytest.mark.unit
PARAMS = ("0.weight", "0.bias", "1.weight", "1.bias")


def _built(precision: str, width: int = 3, steps: int = 2) -> tuple[nn.Module, Any]:
    """A stored module and its optimizer after ``steps`` real steps (moments not zero)."""
    torch.manual_seed(0)
    actor = ActorConfig(precision=precision, lr=1e-2)  # type: ignore[arg-type]
    model = nn.Sequential(nn.Linear(4, width), nn.LayerNorm(width))
    store_params(model, actor)
    opt = build_optimizer(model.parameters(), actor)
    for _ in range(steps):
        model(torch.randn(5, 4, dtype=next(model.parameters()).dtype)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return model, opt


def _state(model: nn.Module, opt: Any) -> dict[str, Any]:
    msd, osd = get_state_dict(model, opt)
    return {"model": msd, "optim": osd}


def _layout(precision: str, width: int = 3) -> dict[str, Entry]:
    return own_entries(flatten_state_dict(_state(*_built(precision, width, 0)))[0])


def test_the_same_settings_load_as_saved() -> None:
    for precision in ("mixed", "bf16"):
        plan = plan_load(_layout(precision), _layout(precision))
        assert plan.identity and not plan.problems and plan.summary() == "as saved"


def test_mixed_to_bf16_derives_the_kahan_pair_and_converts_the_moments() -> None:
    plan = plan_load(_layout("mixed"), _layout("bf16"))
    assert not plan.problems
    assert plan.to_kahan == tuple(sorted(PARAMS)) and plan.from_kahan == ()
    # The compensation slots are filled from the masters; BF16AdamW's param groups are
    # a subset of AdamW's, so nothing else is kept as built.
    assert plan.skip == {f"optim.state.{p}.compensation" for p in PARAMS}
    moments = {f"optim.state.{p}.{m}" for p in PARAMS for m in ("exp_avg", "exp_avg_sq")}
    assert plan.convert == moments | {f"model.{p}" for p in PARAMS}
    assert "4 weights from their saved masters" in plan.summary()


def test_bf16_to_mixed_folds_the_compensation_and_keeps_adamws_own_flags() -> None:
    plan = plan_load(_layout("bf16"), _layout("mixed"))
    assert not plan.problems and plan.from_kahan == tuple(sorted(PARAMS))
    kept = {k.rpartition(".")[2] for k in plan.skip}
    assert "fused" in kept and "amsgrad" in kept and not kept & HYPERPARAMETERS


def _without(entries: dict[str, Entry], *gone: str) -> dict[str, Entry]:
    return {k: v for k, v in entries.items() if k not in gone}


@pytest.mark.parametrize(("saved", "mine", "named"), [
    # Another width: a LoRA rank or a model changed under a kept checkpoint claim.
    (_layout("mixed", 3), _layout("mixed", 5), "model.0.weight: the checkpoint has "
                                               "float32[3, 4], this run float32[5, 4]"),
    (_without(_layout("mixed"), "optim.state.0.bias.exp_avg"), _layout("mixed"),
     "optim.state.0.bias.exp_avg: this run has float32[3], the checkpoint has none"),
    (_without(_layout("mixed"), "optim.param_groups.0.lr"), _layout("mixed"),
     "optim.param_groups.0.lr: this run has a value"),
    ({**_layout("mixed"), "optim.state.0.bias.max_exp_avg_sq": Entry("float32", (3,))},
     _layout("mixed"), "optim.state.0.bias.max_exp_avg_sq: the checkpoint has float32[3], "
                       "this run has no such entry"),
    ({**_layout("mixed"), "model.0.bias": Entry("int64", (3,))}, _layout("mixed"),
     "not a floating-point conversion"),
    ({**_layout("mixed"), "optim.param_groups.0.lr": Entry("float32", ())}, _layout("mixed"),
     "optim.param_groups.0.lr: the checkpoint has float32[], this run a value"),
    # A param group this run does not have: its hyper-parameters would be dropped.
    ({**_layout("mixed"), "optim.param_groups.1.lr": Entry(None)}, _layout("mixed"),
     "optim.param_groups.1.lr: the checkpoint has a value, this run has no such entry"),
], ids=["shape", "missing-moment", "missing-lr", "extra-state", "int-dtype", "tensor-lr",
        "extra-group"])
def test_what_cannot_load_is_named(saved: dict[str, Entry], mine: dict[str, Entry],
                                   named: str) -> None:
    problems = plan_load(saved, mine).problems
    assert any(named in p for p in problems), problems


def test_the_message_names_step_keys_and_what_to_do_and_survives_ray() -> None:
    problems = tuple(f"model.layer{i}.weight: the checkpoint has float32[4], this run "
                     f"float32[8]" for i in range(5))
    text = incompatible_message(12, "/checkpoints/ns/job/step-12", problems, "actor.precision bf16")
    assert text.startswith("checkpoint step 12 (/checkpoints/ns/job/step-12) cannot be loaded "
                           "with this run's settings (actor.precision bf16): model.layer0")
    assert "model.layer2" in text and "model.layer3" not in text and "(and 2 more)" in text
    assert "kept" in text and "allowPrecisionChange" in text and "grpo-train export" in text
    # Ray pickles a rank's exception to the driver: it must come back whole.
    back = pickle.loads(pickle.dumps(CheckpointIncompatible(text)))
    assert isinstance(back, CheckpointIncompatible) and str(back) == text


def _save(tmp: Path, precision: str) -> tuple[dict[str, torch.Tensor], Path]:
    model, opt = _built(precision)
    state = _state(model, opt)
    flat = {k: v.clone() for k, v in flatten_state_dict(state)[0].items()
            if isinstance(v, torch.Tensor)}
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state, checkpoint_id=str(tmp), no_dist=True)
    return flat, tmp


def _load(path: Path, precision: str) -> tuple[Any, dict[str, torch.Tensor]]:
    model, opt = _built(precision, steps=0)
    load = prepare(_state(model, opt), saved_entries(FileSystemReader(str(path)).read_metadata()))
    assert not load.plan.problems
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(load.targets, checkpoint_id=str(path), no_dist=True)
    state = finish(load)
    flat = flatten_state_dict(state)[0]
    return state, {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}


def test_a_mixed_checkpoint_loads_into_bf16_as_master_rounded_plus_residual(
    tmp_path: Path,
) -> None:
    saved, path = _save(tmp_path, "mixed")
    state, got = _load(path, "bf16")
    for p in PARAMS:
        master, weight = saved[f"model.{p}"], got[f"model.{p}"]
        comp = got[f"optim.state.{p}.compensation"]
        assert torch.equal(weight, master.bfloat16())
        assert torch.equal(comp, (master - master.bfloat16().float()).bfloat16())
        for m in ("exp_avg", "exp_avg_sq"):
            key = f"optim.state.{p}.{m}"
            assert got[key].dtype == torch.bfloat16 and torch.equal(got[key], saved[key].bfloat16())
        assert float(got[f"optim.state.{p}.step"]) == 2.0
    assert any(got[f"optim.state.{p}.compensation"].any() for p in PARAMS)
    group = state["optim"]["param_groups"][0]
    assert group["lr"] == 1e-2 and "fused" not in group  # BF16AdamW's own groups


def test_a_bf16_checkpoint_loads_into_mixed_as_weight_plus_compensation(tmp_path: Path) -> None:
    saved, path = _save(tmp_path, "bf16")
    state, got = _load(path, "mixed")
    assert not any(k.endswith(".compensation") for k in got)
    for p in PARAMS:
        comp = saved[f"optim.state.{p}.compensation"]
        want = saved[f"model.{p}"].float() + comp.float()
        assert got[f"model.{p}"].dtype == torch.float32
        assert torch.equal(got[f"model.{p}"], want)
        for m in ("exp_avg", "exp_avg_sq"):
            key = f"optim.state.{p}.{m}"
            assert torch.equal(got[key], saved[key].float())
    assert state["optim"]["param_groups"][0]["fused"] is True  # AdamW's own flag, kept
