"""LoRA on the tiny text task: it learns with the reference taken from the same model,
its checkpoints hold adapters only and resume bit-exact after SIGKILL, and the export
is the base plus the scaled adapters (merged) or a PEFT adapter directory."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_testkit.configs import text_config
from grpo_testkit.crash import CrashServer, crash_run_config, step_metrics
from grpo_testkit.datasets import write_text_task
from grpo_trainer.checkpointing.dcp import committed_step
from grpo_trainer.checkpointing.export import ExportError, export, load_model_tensors
from grpo_trainer.config import build_config
from grpo_trainer.driver.driver import GRPOTrainer
from grpo_trainer.rank.worker import Worker

pytestmark = pytest.mark.trainer

LORA = {"rank": 4, "alpha": 8.0}
STEPS = 4
KILLS = 3


@pytest.fixture(scope="module")
def lora_lm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with weights at a scale where its frozen head leaves LoRA room to
    learn (see ``build_tiny_qwen2``)."""
    from grpo_testkit.tiny_models import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("lora-qwen2"), init_std=0.1)


def test_lora_learns_the_text_task_and_the_reference_is_the_base(
    lora_lm: Path, tmp_path: Path, ray_local: None
) -> None:
    data = write_text_task(tmp_path / "text.jsonl")
    raw = text_config(
        lora_lm,
        data,
        trainer={"total_steps": 16},
        actor={"lr": 5e-2, "lora": LORA},
        algorithm={"kl_coef": 1e-3},
    )
    trainer = GRPOTrainer(build_config(raw, environ={}))
    try:
        history = trainer.run()
        assert trainer.group is not None
        gaps = trainer.group.call(Worker.rollout_log_prob_gap)
    finally:
        trainer.close()
    rewards = [m["reward/mean"] for m in history]
    print(f"\nLoRA rewards: {[round(r, 3) for r in rewards]}")
    start, end = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert end > start + 0.15, f"reward did not rise: {rewards}"
    # The transformers engine got the merged weights: its log-probs are the actor's.
    assert max(gaps) < 1e-3
    # The reference is the model with its adapters off: the KL to it grows from zero.
    assert history[0]["actor/kl"] == pytest.approx(0.0, abs=1e-7)
    assert history[-1]["actor/kl"] > 1e-4


@pytest.fixture(scope="module")
def server() -> Iterator[CrashServer]:
    s = CrashServer()
    yield s
    s.close()


def _run(server: CrashServer, cfg: Path, log: Path) -> None:
    server.start(cfg, log)
    assert server.wait() == 0, log.read_text()[-3000:]


def _size(step_dir: Path) -> int:
    return sum(p.stat().st_size for p in step_dir.iterdir() if p.is_file())


def _tensor_bytes(step_dir: Path) -> int:
    """Bytes of the saved tensors (model and optimizer), without DCP's per-item framing."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    items = FileSystemReader(str(step_dir)).read_metadata().state_dict_metadata.values()
    return sum(
        md.size.numel() * torch.empty((), dtype=md.properties.dtype).element_size()
        for md in items
        if isinstance(md, TensorStorageMetadata)
    )


@pytest.fixture(scope="module")
def lora_run(
    server: CrashServer, tiny_lm: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    """An uninterrupted LoRA run: (its checkpoint root, its log)."""
    tmp = tmp_path_factory.mktemp("lora-ref")
    data = write_text_task(tmp / "t.jsonl")
    _run(server, _config(tmp, tiny_lm, data, "ref", lora=LORA), tmp / "ref.log")
    return tmp / "ref", tmp / "ref.log"


def test_a_lora_checkpoint_holds_adapters_only_a_small_fraction_of_a_full_one(
    server: CrashServer, tiny_lm: Path, tmp_path: Path, lora_run: tuple[Path, Path]
) -> None:
    root, _ = lora_run
    tensors = load_model_tensors(root / f"step-{STEPS}")
    assert tensors and all(".lora_A." in k or ".lora_B." in k for k in tensors)
    data = write_text_task(tmp_path / "t.jsonl")
    _run(server, _config(tmp_path, tiny_lm, data, "full"), tmp_path / "full.log")
    lora_dir, full_dir = root / f"step-{STEPS}", tmp_path / "full" / f"step-{STEPS}"
    lora_tensors, full_tensors = _tensor_bytes(lora_dir), _tensor_bytes(full_dir)
    print(
        f"\nLoRA checkpoint: {lora_tensors} tensor bytes, {_size(lora_dir)} on disk; "
        f"full: {full_tensors} tensor bytes, {_size(full_dir)} on disk"
    )
    # Adapters (rank 4, about 6% of this tiny model's parameters) and their Adam state.
    assert lora_tensors < 0.1 * full_tensors
    # On disk DCP's per-tensor framing weighs in on a model this small.
    assert _size(lora_dir) < 0.25 * _size(full_dir)
    with pytest.raises(ExportError, match="--adapter-out needs a LoRA checkpoint"):
        export(tmp_path / "full", tmp_path / "out", adapter_out=tmp_path / "adapter")


def test_lora_resumes_bit_exact_after_sigkill(
    server: CrashServer, tiny_lm: Path, tmp_path: Path, lora_run: tuple[Path, Path]
) -> None:
    ref_root, ref_log = lora_run
    ref_metrics = step_metrics(ref_log)
    assert sorted(ref_metrics) == list(range(1, STEPS + 1))
    data = write_text_task(tmp_path / "t.jsonl")
    cfg = _config(tmp_path, tiny_lm, data, "chain", lora=LORA)
    root = tmp_path / "chain"
    rng = random.Random(2111)
    kills, attempt = 0, 0
    while True:
        attempt += 1
        expect = committed_step(root)
        log = tmp_path / f"attempt-{attempt}.log"
        server.start(cfg, log)
        status = None
        if kills < KILLS:
            # Wait for this attempt to commit a step, then kill it a moment later:
            # inside the next step or its save.
            while status is None and (committed_step(root) or 0) <= (expect or 0):
                status = server.poll()
                time.sleep(0.005)
            if status is None:
                time.sleep(rng.uniform(0.0, 0.3))
                if server.kill():
                    kills += 1
        status = server.wait()
        text = log.read_text()
        assert "Traceback" not in text, text[-3000:]
        if expect is not None and status == 0:
            assert f"resumed from checkpoint step {expect} " in text, text[-3000:]
        for step, m in step_metrics(log).items():
            assert m == ref_metrics[step], f"attempt {attempt} step {step} differs"
        if status == 0:
            break
        assert status == -9, text[-3000:]
    assert kills >= 1
    ours = load_model_tensors(root / f"step-{STEPS}")
    theirs = load_model_tensors(ref_root / f"step-{STEPS}")
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert torch.equal(ours[k], theirs[k]), k


def test_merged_export_is_base_plus_scaled_adapters_and_loads_in_transformers(
    tiny_lm: Path, tmp_path: Path, lora_run: tuple[Path, Path]
) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    root, _ = lora_run
    adapters = load_model_tensors(root / f"step-{STEPS}")
    done = export(root, tmp_path / "merged", dtype="float32", adapter_out=tmp_path / "adapter")
    assert done.step == STEPS
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_lm, dtype=torch.float32)
    got, want = merged.state_dict(), base.state_dict()
    scale = LORA["alpha"] / LORA["rank"]
    adapted = {k.rsplit(".", 2)[0] for k in adapters}
    assert "model.layers.0.self_attn.q_proj" in adapted and "lm_head" not in adapted
    for name, w in want.items():
        layer = name.removesuffix(".weight")
        if layer in adapted and name.endswith(".weight"):
            a, b = adapters[f"{layer}.lora_A.weight"], adapters[f"{layer}.lora_B.weight"]
            assert b.abs().max() > 0, f"{layer}: adapter never trained"
            assert torch.allclose(got[name], w + scale * b @ a, atol=1e-6), name
            assert not torch.allclose(got[name], w), name
        else:
            assert torch.equal(got[name], w), name
    peft = load_file(str(tmp_path / "adapter" / "adapter_model.safetensors"))
    assert peft.keys() == {f"base_model.model.{k}" for k in adapters}
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"]) == (LORA["rank"], LORA["alpha"])
    assert config["base_model_name_or_path"] == str(tiny_lm)


@pytest.mark.parametrize(
    ("strategy", "dtype"), [("rank0", "float32"), ("sharded", "bfloat16"), ("naive", "float32")]
)
def test_every_init_strategy_loads_the_base_and_starts_the_adapters_at_zero_update(
    tiny_lm: Path, strategy: str, dtype: str
) -> None:
    """2 spawned gloo ranks. The base is from_pretrained's (in the compute dtype, frozen),
    B is zero and A a real draw on every rank (the sharded ranks start from the meta
    device), and a bf16 base with fp32 adapters runs forward and backward under FSDP2."""
    from grpo_api.trainer_config import ModelConfig
    from grpo_testkit.dist import run_ranks
    from grpo_testkit.lora_check import build_lora_actor
    from grpo_trainer.model.modeling import load_full

    arg = {"model": str(tiny_lm), "strategy": strategy, "dtype": dtype, "lora": LORA}
    results = run_ranks(build_lora_actor, 2, arg, timeout_s=600)
    base = dict(load_full(ModelConfig(path=str(tiny_lm)), torch.float32).named_parameters())
    compute = getattr(torch, dtype)
    for r in results:
        adapters = {k for k in r["params"] if ".lora_" in k}
        assert r["trainable"] == sorted(adapters) == r["with_grad"]
        assert len(adapters) == 2 * 7 * 2  # q, k, v, o, gate, up, down in 2 layers
        for name, want in base.items():
            assert torch.equal(r["params"][name], want.detach().to(compute).float()), name
            assert r["dtypes"][name] == str(compute), name
        for name in adapters:
            assert r["dtypes"][name] == "torch.float32"
            if ".lora_B." in name:
                assert not r["params"][name].any(), name
            else:
                assert r["params"][name].std() > 0.01, name
        assert all(torch.equal(r["params"][k], results[0]["params"][k]) for k in adapters)


def _config(tmp: Path, model: Path, data: Path, name: str, **actor: Any) -> Path:
    return crash_run_config(tmp, model, data, name, steps=STEPS, actor={"lr": 5e-2, **actor})
