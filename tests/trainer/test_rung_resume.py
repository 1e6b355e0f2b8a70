"""Every rung of the OOM ladder resumes the checkpoint the attempt before it wrote.

A restart after an OOM runs with the ladder's next rung (operator/grpo_operator/planner/
ladder.py): gradient checkpointing on, a halved micro-batch, less GPU memory for vLLM,
bf16 training, optimizer then parameter offload on (CudaOOM); parameter then optimizer
offload off, a smaller Ray object store, more pod memory (HostOOM/RayOOM). The last two
never reach the trainer (no trainer config path in grpo_api.job.trainer.SOURCES; tests/unit/
test_rung_resume_coverage.py holds every rung to the tests here).

One module-scoped run on the tiny Qwen2.5-VL (2 ranks on real Ray, mixed precision, fp32
compute) writes steps 2 and 3. Each test copies step 2, resumes it under one rung's
settings, has the ranks save what they loaded (their own save, before any step), trains
step 3 and checks that it continued: the step counter, the data position, the optimizer's
moments and step count as saved (converted where the precision changed), and step 3
itself against the uninterrupted run where the rung leaves the arithmetic alone.
"""

from __future__ import annotations

import copy
import io
import json
import logging
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_api.trainer_config import ActorConfig, Config, ModelConfig
from grpo_testkit.configs import text_config
from grpo_testkit.datasets import write_vision_task
from grpo_trainer.checkpointing.compat import Entry, plan_load
from grpo_trainer.checkpointing.dcp import DCPCheckpointer
from grpo_trainer.checkpointing.export import load_tensors
from grpo_trainer.checkpointing.files import atomic_write
from grpo_trainer.checkpointing.tracker import Tracker, parse_step_dir
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.driver.metrics import MetricsLogger
from grpo_trainer.rank.worker import Worker

pytestmark = pytest.mark.trainer

VOLATILE = ("time/", "throughput/", "memory/")
ROLLOUT = ("reward/", "response/")  # decided before the update: the loaded weights and data
CUDA = torch.device("cuda", 0)


def _cfg(model: Path, data: Path, ckpt: Path, steps: int, **sections: dict[str, Any]) -> Config:
    base: dict[str, dict[str, Any]] = {
        "checkpoint": {"dir": str(ckpt), "interval_steps": 2, "keep": 3},
        "trainer": {"total_steps": steps},
    }
    return build_config(text_config(model, data, **{**base, **sections}), environ={})


@dataclass
class Run:
    restored: int  # the step the run resumed from
    loader: dict[str, int]  # the data position right after the restore
    metrics: dict[int, dict[str, Any]]  # the JSON metric lines by step, timings left out
    log: str  # the trainer's INFO lines


@contextmanager
def _logged() -> Iterator[io.StringIO]:
    """The trainer's INFO log lines while the block runs (module fixtures have no caplog)."""
    text, logger = io.StringIO(), logging.getLogger("grpo_trainer")
    handler, level = logging.StreamHandler(text), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield text
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _run(cfg: Config, snapshot: Path | None = None) -> Run:
    """Train to the end; with ``snapshot``, the ranks first save what they loaded there."""
    out = io.StringIO()
    metrics = MetricsLogger(cfg.metrics, cfg.trainer.total_steps or 0, stream=out)
    trainer = GRPOTrainer(cfg, checkpointer=DCPCheckpointer(cfg), metrics=metrics)
    with _logged() as log:
        try:
            trainer.start()
            restored, loader = trainer.step, copy.deepcopy(trainer.loader.state_dict())
            if snapshot is not None:
                assert trainer.group is not None
                snapshot.mkdir(parents=True)
                trainer.group.call(Worker.save_checkpoint, common=[str(snapshot), False])
                trainer.group.call(Worker.finish_checkpoint, common=[True])
            trainer.run()
        finally:
            trainer.close()
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    by_step = {m["step"]: {k: v for k, v in m.items() if not k.startswith(VOLATILE)}
               for m in lines}
    return Run(restored, loader, by_step, log.getvalue())


@dataclass
class Base:
    model: Path
    data: Path
    ckpt: Path
    metrics: dict[int, dict[str, Any]]


@pytest.fixture(scope="module")
def base(tiny_vlm: Path, tmp_path_factory: pytest.TempPathFactory, ray_local: None) -> Base:
    tmp = tmp_path_factory.mktemp("rung-base")
    data = write_vision_task(tmp / "vision.parquet")
    run = _run(_cfg(tiny_vlm, data, tmp / "ckpt", 3))
    assert sorted(run.metrics) == [1, 2, 3]
    return Base(tiny_vlm, data, tmp / "ckpt", run.metrics)


@dataclass
class Resumed:
    run: Run
    ckpt: Path  # the resumed run's checkpoint directory
    loaded: Path  # the ranks' save of what they loaded, before any step
    src: Path  # the step directory it resumed from (its copy is in ckpt)


def _resume(src: Path, tmp: Path, b: Base, steps: int, **sections: dict[str, Any]) -> Resumed:
    """A new attempt on a directory holding only ``src``, committed, under ``sections``."""
    ckpt = tmp / "ckpt"
    ckpt.mkdir(parents=True)
    shutil.copytree(src, ckpt / src.name)
    step = parse_step_dir(src.name)
    assert step is not None
    atomic_write(ckpt / "latest", Tracker(step=step, dir=src.name).model_dump_json().encode())
    run = _run(_cfg(b.model, b.data, ckpt, steps, **sections), tmp / "loaded")
    return Resumed(run, ckpt, tmp / "loaded", src)


def _tensors(step_dir: Path) -> dict[str, torch.Tensor]:
    return {**{f"model.{k}": v for k, v in load_tensors(step_dir, "model.").items()},
            **{f"optim.state.{k}": v for k, v in load_tensors(step_dir, "optim.state.").items()}}


def _trainer_state(step_dir: Path) -> dict[str, Any]:
    return dict(json.loads((step_dir / "trainer_state.json").read_text()))


def _assert_continued(r: Resumed) -> None:
    """It resumed from its step, at its data position, with its optimizer's step count."""
    start = parse_step_dir(r.src.name)
    assert start is not None
    last = max(r.run.metrics)
    assert r.run.restored == start and sorted(r.run.metrics) == list(range(start + 1, last + 1))
    assert f"resumed from checkpoint step {start}" in r.run.log
    assert r.run.loader == _trainer_state(r.src)["loader"]
    # Adam's step count went on from the checkpoint's (a fresh optimizer would count from 0).
    steps = {k: v for k, v in _tensors(r.ckpt / f"step-{last}").items() if k.endswith(".step")}
    assert steps and all(float(v) == last for v in steps.values())


def _assert_loaded_as_saved(r: Resumed) -> None:
    """What the ranks hold after the load is, tensor for tensor, what the checkpoint holds."""
    assert "tensors as saved" in r.run.log
    saved, loaded = _tensors(r.src), _tensors(r.loaded)
    assert saved.keys() == loaded.keys()
    for k, v in saved.items():
        assert loaded[k].dtype == v.dtype and torch.equal(loaded[k], v), k


def _assert_step_as_uninterrupted(r: Resumed, b: Base, step: int = 3) -> None:
    assert r.run.metrics[step] == b.metrics[step]
    assert _trainer_state(r.ckpt / f"step-{step}")["loader"] == _trainer_state(
        b.ckpt / f"step-{step}")["loader"]


def _layout(model: Path, actor: ActorConfig) -> dict[str, Entry]:
    """The state a rank with ``actor``'s settings loads into, built by the code every rank
    runs to pick it (precision.store_params, build_optimizer, rank_state.build_scheduler,
    DCP's get_state_dict), on one unsharded process: FSDP shards, and offload moves, only
    where the tensors live; the keys, global shapes and dtypes are the same on a CUDA rank."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from grpo_trainer.checkpointing.convert import own_entries
    from grpo_trainer.model.modeling import load_full
    from grpo_trainer.model.precision import build_optimizer, store_params
    from grpo_trainer.model.rank_state import build_scheduler

    m = load_full(ModelConfig(path=str(model)), torch.float32)
    store_params(m, actor)
    optimizer = build_optimizer(m.parameters(), actor)
    build_scheduler(optimizer, actor)  # it adds the groups' initial_lr
    msd, osd = get_state_dict(m, optimizer)
    return own_entries(flatten_state_dict({"model": msd, "optim": osd})[0])


def _saved_layout(step_dir: Path) -> dict[str, Entry]:
    from torch.distributed.checkpoint import FileSystemReader

    from grpo_trainer.checkpointing.convert import saved_entries

    return saved_entries(FileSystemReader(str(step_dir)).read_metadata())


def test_gradient_checkpointing_on_resumes_exactly(
    base: Base, tmp_path: Path
) -> None:
    # CudaOOM rung 1. Recomputing activations in backward changes no parameter name
    # (HF's own checkpointing, not a wrapper module) and, in fp32 on CPU, no result.
    r = _resume(base.ckpt / "step-2", tmp_path, base, 3, actor={"gradient_checkpointing": True})
    _assert_continued(r)
    _assert_loaded_as_saved(r)
    _assert_step_as_uninterrupted(r, base)


CUT = "actor/micro_batches"  # how the update was cut, which this rung changes
LAYOUT = "update/"  # the forward's tokens per rank, which follow the cut


# CudaOOM rung 2: 8 -> 4 samples a micro-batch, or (micro-batches by tokens, the
# planner's default) a token budget: the least the config takes, one whole sample of
# data.max_prompt_length (512) + rollout.max_new_tokens (8), against the base's 8 samples.
@pytest.mark.parametrize("actor", [{"micro_batch_size": 4}, {"micro_batch_tokens": 520}],
                         ids=["samples", "tokens"])
def test_halved_micro_batch_resumes_with_the_same_rollouts_and_carried_moments(
    base: Base, tmp_path: Path, actor: dict[str, int]
) -> None:
    # Gradients are summed in another order, so the update agrees to float rounding; the
    # rollout, made with the loaded weights on the loaded data position, is the same to
    # the bit.
    r = _resume(base.ckpt / "step-2", tmp_path, base, 3, actor=actor)
    _assert_continued(r)
    _assert_loaded_as_saved(r)
    got, want = r.run.metrics[3], base.metrics[3]
    assert got.keys() == want.keys()
    # The rung took effect: the update was cut otherwise (more micro-batches of 4 samples;
    # with the token budget, the shared layout fits more responses of a group in one).
    assert got[CUT] != want[CUT]
    for k in [k for k in want if k != CUT and not k.startswith(LAYOUT)]:
        if k.startswith(ROLLOUT):
            assert got[k] == want[k], k
        else:
            assert got[k] == pytest.approx(want[k], rel=1e-3, abs=1e-6), k
    # The step-3 moments are the reference's: 0.9 x the carried exp_avg + 0.1 x the new
    # gradient (moments started afresh would be 0.1 x the gradient alone).
    ours, ref = _tensors(r.ckpt / "step-3"), _tensors(base.ckpt / "step-3")
    for k, v in ref.items():
        if k.endswith((".exp_avg", ".exp_avg_sq")):
            torch.testing.assert_close(ours[k], v, rtol=1e-3, atol=1e-7, msg=k)


def test_lower_vllm_memory_resumes_exactly(
    base: Base, tmp_path: Path
) -> None:
    # CudaOOM rung 3. No checkpoint holds anything of vLLM, on any device; here the
    # transformers engine (the CPU default) does not read the fraction at all, and the
    # tensor parallelism this rung may raise with it needs vLLM, so it stays 1.
    r = _resume(base.ckpt / "step-2", tmp_path, base, 3,
                rollout={"gpu_memory_utilization": 0.5})
    _assert_continued(r)
    _assert_loaded_as_saved(r)
    _assert_step_as_uninterrupted(r, base)


@pytest.mark.parametrize("knob", ["offload_optimizer", "offload_params"])
def test_offload_on_then_off_resumes_exactly(
    base: Base, tmp_path: Path, knob: str
) -> None:
    """CudaOOM rungs 5 and 6 turn it on, HostOOM/RayOOM rungs 1 and 2 off again.

    On CPU ranks offloading is a no-op (modeling.params_home, rank_state.optimizer_home
    keep a CPU rank's tensors where they are), so here both resumes load as a plain one
    does. What a CUDA rank would load is checked through the code that picks it: the same
    keys, shapes and dtypes whichever way the knob is set, and the base checkpoint loads
    into them as saved; only the tensors' home changes, which DCP does not record."""
    from grpo_trainer.model.modeling import params_home
    from grpo_trainer.model.rank_state import optimizer_home

    on, off = (ActorConfig.model_validate({knob: v}) for v in (True, False))
    home = params_home if knob == "offload_params" else optimizer_home
    assert home(on, CUDA) == torch.device("cpu") and home(off, CUDA) == CUDA
    layout = _layout(base.model, on)
    assert layout == _layout(base.model, off)
    assert plan_load(_saved_layout(base.ckpt / "step-2"), layout).identity

    r = _resume(base.ckpt / "step-2", tmp_path / "on", base, 3, actor={knob: True})
    _assert_continued(r)
    _assert_loaded_as_saved(r)
    _assert_step_as_uninterrupted(r, base)
    back = _resume(r.ckpt / "step-3", tmp_path / "off", base, 4, actor={knob: False})
    _assert_continued(back)
    _assert_loaded_as_saved(back)


@pytest.fixture(scope="module")
def to_bf16(base: Base, tmp_path_factory: pytest.TempPathFactory) -> Resumed:
    """CudaOOM rung 4 (with spec.restartPolicy.allowPrecisionChange): the mixed step 2
    resumed with actor.precision bf16, trained to step 3."""
    return _resume(base.ckpt / "step-2", tmp_path_factory.mktemp("to-bf16"), base, 3,
                   actor={"precision": "bf16"})


def _param(weight_key: str) -> str:
    return weight_key.removeprefix("model.")


def test_bf16_resumes_a_mixed_checkpoint_with_its_master_as_the_kahan_pair(
    base: Base, to_bf16: Resumed
) -> None:
    r = to_bf16
    _assert_continued(r)
    assert "weights from their saved masters, rounded" in r.run.log
    saved, loaded = _tensors(r.src), _tensors(r.loaded)
    weights = [k for k in saved if k.startswith("model.")]
    comps = {f"optim.state.{_param(k)}.compensation" for k in weights}
    assert loaded.keys() == saved.keys() | comps
    for k in weights:
        master = saved[k]
        comp = loaded[f"optim.state.{_param(k)}.compensation"]
        # The weight is the master rounded to bf16, the compensation what that lost:
        # together they hold the fp32 master to ~16 bits (bf16 alone: 8).
        assert loaded[k].dtype == comp.dtype == torch.bfloat16, k
        assert torch.equal(loaded[k], master.bfloat16()), k
        assert torch.equal(comp, (master - master.bfloat16().float()).bfloat16()), k
        pair_error = (loaded[k].float() + comp.float() - master).abs()
        assert (pair_error <= master.abs() * 2.0**-15 + 1e-30).all(), k
    assert any(loaded[f"optim.state.{_param(k)}.compensation"].any() for k in weights)
    for k, v in saved.items():  # Adam's moments carried over, rounded; its step count as is
        if k.endswith((".exp_avg", ".exp_avg_sq")):
            assert loaded[k].dtype == torch.bfloat16 and torch.equal(loaded[k], v.bfloat16()), k
        elif k.endswith(".step"):
            assert torch.equal(loaded[k], v), k
    # Step 3 took the uninterrupted run's prompts, and the run goes on in bf16.
    assert _trainer_state(r.ckpt / "step-3")["loader"] == _trainer_state(
        base.ckpt / "step-3")["loader"]
    final = _tensors(r.ckpt / "step-3")
    assert {v.dtype for k, v in final.items() if not k.endswith(".step")} == {torch.bfloat16}
    # A CUDA rank loads by the same plan: it depends on keys, shapes and dtypes only.
    plan = plan_load(_saved_layout(r.src), _layout(base.model, ActorConfig(precision="bf16")))
    assert not plan.problems and plan.to_kahan == tuple(sorted(_param(k) for k in weights))


def test_mixed_resumes_a_bf16_checkpoint_with_weight_plus_compensation_as_master(
    base: Base, to_bf16: Resumed, tmp_path: Path
) -> None:
    # The way back: allowPrecisionChange turned off after the bf16 rung applied replans
    # the next attempt in mixed precision (docs/memory-model.md).
    r = _resume(to_bf16.ckpt / "step-3", tmp_path, base, 4)
    _assert_continued(r)
    assert "weights plus their saved Kahan compensation as masters" in r.run.log
    saved, loaded = _tensors(r.src), _tensors(r.loaded)
    assert loaded.keys() == {k for k in saved if not k.endswith(".compensation")}
    for k, v in loaded.items():
        assert v.dtype == torch.float32, k
        if k.startswith("model."):
            comp = saved[f"optim.state.{_param(k)}.compensation"]
            assert torch.equal(v, saved[k].float() + comp.float()), k
        else:
            assert torch.equal(v, saved[k].float()), k
